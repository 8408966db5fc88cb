/*
 * Draws the report's charts with uPlot (inlined before this script) from the JSON in
 * #report-data. Plain browser JavaScript, inlined into report.html by lib/report/html.ts.
 * After a chart's first draw its figure gets data-rendered="<canvas width>x<canvas height>", and
 * <body data-charts-rendered> counts the charts drawn so far (tests read both).
 */
(function () {
  'use strict';
  var data = JSON.parse(document.getElementById('report-data').textContent);
  var HEIGHT = 240;
  var rendered = 0;
  var plots = [];

  function widthOf(el) {
    return Math.max(320, Math.floor(el.clientWidth));
  }

  function markDrawn(u, figure) {
    if (figure.dataset.rendered) return;
    var canvas = u.root.querySelector('canvas');
    figure.dataset.rendered = canvas.width + 'x' + canvas.height;
    rendered++;
    document.body.dataset.chartsRendered = String(rendered);
  }

  /* Tick labels with as many decimals as the tick spacing needs (uPlot's default stops at 3). */
  function ticks(u, splits, axisIdx, space, incr) {
    var decimals = Math.max(0, Math.ceil(-Math.log10(incr) - 1e-9));
    return splits.map(function (v) {
      return v.toLocaleString('en-US', { minimumFractionDigits: decimals, maximumFractionDigits: decimals });
    });
  }

  function fade(hex, alpha) {
    var n = parseInt(hex.slice(1), 16);
    return 'rgba(' + (n >> 16) + ',' + ((n >> 8) & 255) + ',' + (n & 255) + ',' + alpha + ')';
  }

  /* Line chart: step on x; one series per metric; an optional mean ± std band around the first. */
  function lineChart(chart, el) {
    var series = [{ label: 'step' }];
    var values = [data.steps];
    chart.series.forEach(function (s) {
      series.push({ label: s.label, stroke: s.color, width: 2, spanGaps: true });
      values.push(s.values);
    });
    var bands;
    if (chart.band) {
      var color = chart.series[0].color;
      var edge = { stroke: fade(color, 0.35), width: 1, spanGaps: true, points: { show: false } };
      series.push(Object.assign({ label: '+ std' }, edge), Object.assign({ label: '− std' }, edge));
      values.push(chart.band.upper, chart.band.lower);
      bands = [{ series: [series.length - 2, series.length - 1], fill: fade(color, 0.15) }];
    }
    var opts = {
      width: widthOf(el),
      height: HEIGHT,
      scales: { x: { time: false } },
      axes: [{ label: 'step' }, { values: ticks, size: 60 }],
      series: series,
    };
    if (bands) opts.bands = bands;
    return { opts: opts, values: values };
  }

  /* Timeline: seconds since the run's start on x, step on y, one bar per step phase. */
  function timelineChart(chart, el) {
    var bars = chart.bars;
    var end = Math.max.apply(
      null,
      bars.map(function (b) {
        return b.end;
      }),
    );
    var steps = bars.map(function (b) {
      return b.step;
    });
    var lo = Math.min.apply(null, steps) - 0.6;
    var hi = Math.max.apply(null, steps) + 0.6;
    var rows = hi - lo;
    var opts = {
      width: widthOf(el),
      height: Math.max(HEIGHT, Math.min(600, 40 + rows * 14)),
      legend: { show: false },
      cursor: { y: false },
      scales: {
        x: {
          time: false,
          auto: false,
          range: function () {
            return [0, end];
          },
        },
        y: {
          auto: false,
          range: function () {
            return [lo, hi];
          },
        },
      },
      axes: [
        { label: 'seconds since start' },
        {
          label: 'step',
          incrs: [1, 2, 5, 10, 20, 50, 100, 200, 500, 1000],
          values: function (u, ticks) {
            return ticks.map(function (t) {
              return Number.isInteger(t) ? String(t) : '';
            });
          },
        },
      ],
      series: [{}, { label: 'steps', stroke: 'transparent', points: { show: false } }],
      hooks: {
        draw: [
          function (u) {
            var ctx = u.ctx;
            var rowPx = Math.abs(u.valToPos(0, 'y', true) - u.valToPos(1, 'y', true));
            var h = Math.max(2, Math.min(rowPx * 0.7, 18 * devicePixelRatio));
            ctx.save();
            bars.forEach(function (b) {
              var x0 = u.valToPos(b.start, 'x', true);
              var x1 = u.valToPos(b.end, 'x', true);
              var y = u.valToPos(b.step, 'y', true);
              ctx.fillStyle = data.phaseColors[b.phase];
              ctx.fillRect(x0, y - h / 2, Math.max(1, x1 - x0), h);
            });
            ctx.restore();
          },
        ],
      },
    };
    return {
      opts: opts,
      values: [
        [0, end],
        [null, null],
      ],
    };
  }

  data.charts.forEach(function (chart) {
    var figure = document.getElementById('chart-' + chart.id);
    var el = figure.querySelector('.plot');
    var built = chart.kind === 'timeline' ? timelineChart(chart, el) : lineChart(chart, el);
    var hooks = built.opts.hooks || (built.opts.hooks = {});
    (hooks.draw || (hooks.draw = [])).push(function (u) {
      markDrawn(u, figure);
    });
    plots.push({ el: el, height: built.opts.height, plot: new uPlot(built.opts, built.values, el) });
  });

  window.addEventListener('resize', function () {
    plots.forEach(function (p) {
      p.plot.setSize({ width: widthOf(p.el), height: p.height });
    });
  });
})();
