/**
 * What the run report shows, gathered from a run folder: per-step metrics from `metrics.jsonl`
 * turned into chart series, the step timeline, the resolved configs and any eval results. Missing
 * fields are nulls; a chart whose series are all null is shown as "no data".
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import { readEvalResults, type EvalResults } from '../eval/results';
import { readStepMetrics, type StepRecord } from '../runfolder/metrics';
import { readJsonFile } from '../json';

export type Values = (number | null)[];

export interface LineSeries {
  label: string;
  values: Values;
  color: string;
}

export interface LineChart {
  kind: 'line';
  id: string;
  title: string;
  series: LineSeries[];
  /** A shaded band around the first series (mean ± std). */
  band?: { label: string; lower: Values; upper: Values };
}

export type Phase = 'generation' | 'waiting' | 'training';

export interface TimelineBar {
  step: number;
  phase: Phase;
  /** Seconds since the run's first recorded start. */
  start: number;
  end: number;
}

export interface TimelineChart {
  kind: 'timeline';
  id: string;
  title: string;
  bars: TimelineBar[];
}

export type Chart = LineChart | TimelineChart;

export interface ConfigFile {
  name: string;
  /** Flattened `a.b.c` keys with JSON-rendered values, in file order. */
  entries: [string, string][];
}

export interface ReportData {
  runName: string;
  steps: number[];
  charts: Chart[];
  configs: ConfigFile[];
  evals: EvalResults[];
}

const num = (v: unknown): number | null => (typeof v === 'number' && Number.isFinite(v) ? v : null);

function field(records: readonly StepRecord[], name: string): Values {
  return records.map((r) => num(r[name]));
}

function lineChart(id: string, title: string, series: LineSeries[], band?: LineChart['band']): LineChart {
  return band ? { kind: 'line', id, title, series, band } : { kind: 'line', id, title, series };
}

/** The reward chart: mean with a ±std band where both are known. */
function rewardChart(records: readonly StepRecord[]): LineChart {
  const mean = field(records, 'reward_mean');
  const std = field(records, 'reward_std');
  const edge = (sign: number) => mean.map((m, i) => (m === null || std[i] === null ? null : m + sign * std[i]!));
  const upper = edge(1);
  const band = upper.some((v) => v !== null) ? { label: '± std', lower: edge(-1), upper } : undefined;
  return lineChart('reward', 'Reward', [{ label: 'reward (mean)', values: mean, color: '#2563eb' }], band);
}

interface StepTimes {
  generate_start: number;
  generate_end: number;
  train_start: number;
  train_end: number;
}

function stepTimes(r: StepRecord): Partial<StepTimes> {
  const t = r.time;
  if (typeof t !== 'object' || t === null) return {};
  const o = t as Record<string, unknown>;
  const out: Partial<StepTimes> = {};
  for (const k of ['generate_start', 'generate_end', 'train_start', 'train_end'] as const) {
    const v = num(o[k]);
    if (v !== null) out[k] = v;
  }
  return out;
}

/**
 * Per step: generating its rollouts, its batch waiting for the trainer (generation done, training
 * not started: the trainer is still on an earlier step), and training on it.
 */
function timelineChart(records: readonly StepRecord[]): TimelineChart {
  const raw: { step: number; phase: Phase; start: number; end: number }[] = [];
  for (const r of records) {
    const t = stepTimes(r);
    const add = (phase: Phase, start?: number, end?: number) => {
      if (start !== undefined && end !== undefined && end > start) raw.push({ step: r.step, phase, start, end });
    };
    add('generation', t.generate_start, t.generate_end);
    add('waiting', t.generate_end, t.train_start);
    add('training', t.train_start, t.train_end);
  }
  const t0 = Math.min(...raw.map((b) => b.start));
  return {
    kind: 'timeline',
    id: 'timeline',
    title: 'Step timeline',
    bars: raw.map((b) => ({ ...b, start: b.start - t0, end: b.end - t0 })),
  };
}

function flatten(value: unknown, prefix: string, out: [string, string][]): void {
  if (value !== null && typeof value === 'object' && !Array.isArray(value) && Object.keys(value).length > 0) {
    for (const [k, v] of Object.entries(value)) flatten(v, prefix ? `${prefix}.${k}` : k, out);
  } else if (Array.isArray(value) && value.some((v) => v !== null && typeof v === 'object')) {
    value.forEach((v, i) => flatten(v, `${prefix}.${i}`, out));
  } else {
    out.push([prefix, JSON.stringify(value)]);
  }
}

function readConfigs(runDir: string): ConfigFile[] {
  const dir = path.join(runDir, 'configs');
  if (!fs.existsSync(dir)) return [];
  return fs
    .readdirSync(dir)
    .filter((n) => n.endsWith('.json'))
    .sort()
    .map((name) => {
      const file = path.join(dir, name);
      const json = readJsonFile(file);
      const entries: [string, string][] = [];
      flatten(json, '', entries);
      return { name, entries };
    });
}

export function loadReportData(runDir: string): ReportData {
  const dir = path.resolve(runDir);
  if (!fs.existsSync(dir)) throw new Error(`run folder ${dir} does not exist`);
  const records = readStepMetrics(path.join(dir, 'metrics.jsonl'))
    .filter((r) => Number.isFinite(r.step))
    .sort((a, b) => a.step - b.step);
  const charts: Chart[] = [
    rewardChart(records),
    lineChart('loss', 'Loss', [
      { label: 'loss', values: field(records, 'loss'), color: '#dc2626' },
      { label: 'validation loss', values: field(records, 'val_loss'), color: '#9333ea' },
    ]),
    lineChart('mismatch_kl', 'Mismatch KL (trainer vs inference)', [
      { label: 'mismatch KL', values: field(records, 'mismatch_kl'), color: '#ea580c' },
    ]),
    lineChart('entropy', 'Entropy', [{ label: 'entropy', values: field(records, 'entropy'), color: '#059669' }]),
    lineChart('tokens_per_s', 'Throughput', [
      { label: 'tokens/s', values: field(records, 'tokens_per_s'), color: '#0891b2' },
    ]),
    timelineChart(records),
  ];
  return {
    runName: path.basename(dir),
    steps: records.map((r) => r.step),
    charts,
    configs: readConfigs(dir),
    evals: readEvalResults(dir),
  };
}

/** Whether a chart has anything to draw. */
export function hasData(chart: Chart): boolean {
  return chart.kind === 'timeline' ? chart.bars.length > 0 : chart.series.some((s) => s.values.some((v) => v !== null));
}
