/**
 * The report page: one self-contained HTML file (uPlot's JS and CSS, the data and the drawing
 * script are inlined; nothing is fetched), so it can be copied anywhere and opened offline.
 * Charts without data are rendered by the server as "no data" placeholders; the rest are drawn by
 * `client.js`, which marks the page with `data-charts-rendered` once uPlot has drawn them.
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import { evalTable } from '../eval/table';
import { projectRoot } from '../paths';
import { formatDuration } from '../run-ops/progress';
import { hasData, type Chart, type ConfigFile, type Phase, type ReportData } from './data';

const PHASE_COLORS: Record<Phase, string> = { generation: '#2563eb', waiting: '#d1d5db', training: '#f59e0b' };

const PHASE_LABELS: Record<Phase, string> = {
  generation: 'generation',
  waiting: 'waiting (batch ready, trainer busy)',
  training: 'training',
};

/**
 * Config keys worth a glance, by label: the first matching flattened key wins (all matches for
 * environments). Patterns name training's keys, so an rl config's eval section (eval.env,
 * eval.rollouts_per_example) is not taken for them.
 */
const HIGHLIGHTS: [string, RegExp, 'first' | 'all'][] = [
  ['model', /(^|\.)model\.name$/, 'first'],
  ['environments', /^(data\.)?env(\.\d+)?\.id$/, 'all'],
  ['max steps', /(^|\.)max_steps$/, 'first'],
  ['epochs', /(^|\.)epochs$/, 'first'],
  ['batch size', /(^|\.)batch_size$/, 'first'],
  ['rollouts per example', /^(orchestrator\.)?rollouts_per_example$/, 'first'],
  ['seq len', /(^|\.)seq_len$/, 'first'],
  ['async level', /(^|\.)async_level$/, 'first'],
  ['learning rate', /(^|\.)optim\.lr$/, 'first'],
  ['loss', /(^|\.)loss\.type$/, 'first'],
];

const ASSETS = {
  uplotJs: () => fs.readFileSync(require.resolve('uplot/dist/uPlot.iife.min.js'), 'utf8'),
  uplotCss: () => fs.readFileSync(require.resolve('uplot/dist/uPlot.min.css'), 'utf8'),
  client: () => fs.readFileSync(path.join(projectRoot, 'lib', 'report', 'client.js'), 'utf8'),
};

function escapeHtml(text: string): string {
  return text.replace(/[&<>"']/g, (c) => ({ '&': '&amp;', '<': '&lt;', '>': '&gt;', '"': '&quot;', "'": '&#39;' })[c]!);
}

/** JSON that is safe inside a <script> element (no `</script>`, no `<!--`). */
function scriptJson(value: unknown): string {
  return JSON.stringify(value).replace(/</g, '\\u003c');
}

/** Inline script text may not contain `</script`; escaping its slash keeps JS string literals intact. */
function inlineScript(js: string): string {
  return js.replace(/<\/script/gi, '<\\/script');
}

function summary(data: ReportData): string {
  const parts: string[] = [];
  const n = data.steps.length;
  parts.push(n === 0 ? 'no steps recorded' : `${n} step${n === 1 ? '' : 's'} (${data.steps[0]}–${data.steps[n - 1]})`);
  for (const chart of data.charts) {
    if (chart.kind === 'line' && (chart.id === 'reward' || chart.id === 'loss')) {
      const last = chart.series[0].values.filter((v): v is number => v !== null).at(-1);
      if (last !== undefined) parts.push(`last ${chart.series[0].label.replace(' (mean)', '')} ${last.toPrecision(4)}`);
    }
    if (chart.kind === 'timeline' && chart.bars.length > 0)
      parts.push(`${formatDuration(Math.max(...chart.bars.map((b) => b.end)))} wall time`);
  }
  return parts.join(' · ');
}

function highlights(configs: readonly ConfigFile[]): string {
  const entries = configs.flatMap((c) => c.entries);
  const items: string[] = [];
  for (const [label, pattern, mode] of HIGHLIGHTS) {
    const values = [...new Set(entries.filter(([k]) => pattern.test(k)).map(([, v]) => v))];
    if (values.length === 0) continue;
    const shown = (mode === 'all' ? values : values.slice(0, 1)).map((v) => v.replace(/^"(.*)"$/, '$1')).join(', ');
    items.push(`<div><dt>${escapeHtml(label)}</dt><dd>${escapeHtml(shown)}</dd></div>`);
  }
  return items.length > 0 ? `<dl class="highlights">${items.join('')}</dl>` : '';
}

function configDetails(c: ConfigFile): string {
  const rows = c.entries.map(([k, v]) => `<tr><td>${escapeHtml(k)}</td><td>${escapeHtml(v)}</td></tr>`).join('');
  return `<details class="config"><summary>configs/${escapeHtml(c.name)}</summary><table>${rows}</table></details>`;
}

function chartFigure(chart: Chart): string {
  const caption = `<figcaption>${escapeHtml(chart.title)}</figcaption>`;
  if (!hasData(chart))
    return `<figure class="chart no-data" id="chart-${chart.id}">${caption}<div class="empty">no data</div></figure>`;
  const legend =
    chart.kind === 'timeline'
      ? `<ul class="phases">${(Object.keys(PHASE_LABELS) as Phase[])
          .map((p) => `<li><span style="background:${PHASE_COLORS[p]}"></span>${escapeHtml(PHASE_LABELS[p])}</li>`)
          .join('')}</ul>`
      : '';
  const wide = chart.kind === 'timeline' ? ' wide' : '';
  return `<figure class="chart has-data${wide}" id="chart-${chart.id}">${caption}<div class="plot"></div>${legend}</figure>`;
}

function evalSection(data: ReportData): string {
  if (data.evals.length === 0) return '';
  const { header, rows, numeric } = evalTable(data.evals);
  const cell = (tag: string, text: string, i: number) =>
    `<${tag}${numeric[i] ? ' class="num"' : ''}>${escapeHtml(text)}</${tag}>`;
  return `<section class="evals"><h2>Evaluations</h2><table><thead><tr>${header.map((h, i) => cell('th', h, i)).join('')}</tr></thead><tbody>${rows
    .map((r) => `<tr>${r.map((c, i) => cell('td', c, i)).join('')}</tr>`)
    .join('')}</tbody></table></section>`;
}

const STYLE = `
body { font: 14px/1.45 system-ui, -apple-system, "Segoe UI", sans-serif; color: #111827; margin: 0; background: #f9fafb; }
header, main { max-width: 1280px; margin: 0 auto; padding: 16px 24px; }
h1 { font-size: 22px; margin: 8px 0 4px; } h2 { font-size: 17px; margin: 24px 0 8px; }
.summary { color: #4b5563; margin: 0 0 12px; }
.highlights { display: flex; flex-wrap: wrap; gap: 6px 24px; margin: 0 0 12px; }
.highlights div { display: flex; gap: 6px; } .highlights dt { color: #6b7280; } .highlights dd { margin: 0; font-weight: 600; }
details.config { margin: 4px 0; } details.config summary { cursor: pointer; color: #374151; }
details.config table { font: 12px/1.4 ui-monospace, monospace; border-collapse: collapse; margin: 6px 0 6px 16px; }
details.config td { padding: 1px 12px 1px 0; vertical-align: top; }
.charts { display: grid; grid-template-columns: repeat(auto-fill, minmax(560px, 1fr)); gap: 16px; }
.chart { background: #fff; border: 1px solid #e5e7eb; border-radius: 8px; margin: 0; padding: 10px 12px; min-width: 0; }
.chart figcaption { font-weight: 600; margin-bottom: 6px; }
.chart.wide { grid-column: 1 / -1; }
.empty { height: 120px; display: flex; align-items: center; justify-content: center; color: #9ca3af; font-style: italic; }
.phases { list-style: none; display: flex; gap: 18px; padding: 0; margin: 6px 0 0; color: #374151; font-size: 12px; }
.phases span { display: inline-block; width: 12px; height: 12px; border-radius: 2px; margin-right: 6px; vertical-align: -2px; }
.evals table { border-collapse: collapse; background: #fff; border: 1px solid #e5e7eb; }
.evals th, .evals td { padding: 4px 12px; border-bottom: 1px solid #f3f4f6; text-align: left; }
.evals .num { text-align: right; font-variant-numeric: tabular-nums; }
`;

export function renderReportHtml(data: ReportData): string {
  const drawn = data.charts.filter(hasData).length;
  const title = `${data.runName} · prime-rl report`;
  return `<!doctype html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>${escapeHtml(title)}</title>
<style>${ASSETS.uplotCss()}</style>
<style>${STYLE}</style>
</head>
<body data-charts-expected="${drawn}" data-charts-rendered="0">
<header>
<h1>${escapeHtml(data.runName)}</h1>
<p class="summary">${escapeHtml(summary(data))}</p>
${highlights(data.configs)}
${data.configs.map(configDetails).join('\n')}
</header>
<main>
<section class="charts">
${data.charts.map(chartFigure).join('\n')}
</section>
${evalSection(data)}
</main>
<script>${inlineScript(ASSETS.uplotJs())}</script>
<script id="report-data" type="application/json">${scriptJson({ steps: data.steps, charts: data.charts.filter(hasData), phaseColors: PHASE_COLORS })}</script>
<script>${inlineScript(ASSETS.client())}</script>
</body>
</html>
`;
}
