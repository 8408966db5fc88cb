/**
 * The run report: written from a synthetic run folder, then opened in headless Chromium, which
 * must draw every chart that has data (the page counts uPlot's draws in data-charts-rendered and
 * records each chart's canvas size). Chromium is installed by scripts/setup.sh --tests; without it these
 * tests fail rather than skip.
 */
import { execFileSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { writeEvalResults } from '../lib/eval';
import { loadReportData, writeReport } from '../lib/report';

const CHROMIUM_CANDIDATES = ['/usr/bin/chromium', '/usr/bin/chromium-browser', '/usr/bin/google-chrome'];

function chromium(): string {
  const found = CHROMIUM_CANDIDATES.find((p) => fs.existsSync(p));
  if (!found)
    throw new Error(
      `Chromium not found (looked for ${CHROMIUM_CANDIDATES.join(', ')}); bash scripts/setup.sh --tests installs it (apt package "chromium")`,
    );
  return found;
}

/** Runs headless Chromium on a local file with a throwaway profile and no network. */
function runChromium(args: string[], file: string): string {
  const profile = fs.mkdtempSync(path.join(os.tmpdir(), 'chromium-profile-'));
  try {
    return execFileSync(
      chromium(),
      [
        '--headless',
        '--no-sandbox',
        '--disable-gpu',
        '--disable-quic',
        '--no-first-run',
        '--disable-background-networking',
        '--disable-component-update',
        '--disable-sync',
        '--disable-dev-shm-usage',
        `--user-data-dir=${profile}`,
        '--window-size=1280,1800',
        '--virtual-time-budget=5000',
        ...args,
        `file://${file}`,
      ],
      { encoding: 'utf8', timeout: 60_000, maxBuffer: 64 * 1024 * 1024, stdio: ['ignore', 'pipe', 'pipe'] },
    );
  } finally {
    fs.rmSync(profile, { recursive: true, force: true });
  }
}

interface RenderedPage {
  expected: number;
  rendered: number;
  /** Chart id -> canvas size "WxH" of drawn charts. */
  drawn: Record<string, string>;
  noData: string[];
}

function renderInBrowser(file: string): RenderedPage {
  const dom = runChromium(['--dump-dom'], file);
  const body = /<body([^>]*)>/.exec(dom)?.[1] ?? '';
  const attr = (name: string) => Number(new RegExp(`${name}="(\\d+)"`).exec(body)?.[1]);
  const drawn: Record<string, string> = {};
  for (const m of dom.matchAll(
    /<figure class="chart has-data[^"]*" id="chart-([\w-]+)"(?: data-rendered="(\d+x\d+)")?/g,
  ))
    drawn[m[1]] = m[2] ?? 'not drawn';
  const noData = [...dom.matchAll(/<figure class="chart no-data" id="chart-([\w-]+)"/g)].map((m) => m[1]);
  return { expected: attr('data-charts-expected'), rendered: attr('data-charts-rendered'), drawn, noData };
}

function canvasOk(size: string): boolean {
  const m = /^(\d+)x(\d+)$/.exec(size);
  return m !== null && Number(m[1]) > 0 && Number(m[2]) > 0;
}

let root: string;
beforeAll(() => (root = fs.mkdtempSync(path.join(os.tmpdir(), 'report-'))));
afterAll(() => fs.rmSync(root, { recursive: true, force: true }));

function makeRun(name: string, lines: object[]): string {
  const dir = path.join(root, name);
  fs.mkdirSync(dir, { recursive: true });
  fs.writeFileSync(path.join(dir, 'metrics.jsonl'), lines.map((l) => JSON.stringify(l)).join('\n') + '\n');
  return dir;
}

/** An async RL run: step n generates while the trainer works on step n-1. */
function fullMetrics(steps: number): object[] {
  const t0 = 1_750_000_000.25;
  return Array.from({ length: steps }, (_, n) => {
    const generate_start = t0 + n * 10;
    const generate_end = generate_start + 8 + (n % 3);
    const train_start = Math.max(generate_end + 0.5, t0 + (n + 1) * 10 + 1);
    return {
      step: n,
      reward_mean: 0.05 + (0.75 * n) / steps,
      reward_std: 0.2 - (0.1 * n) / steps,
      loss: 0.5 / (n + 1),
      mismatch_kl: 0.001 + 0.0005 * Math.sin(n),
      entropy: 1.2 - 0.03 * n,
      tokens_per_s: 900 + 20 * n,
      time: { generate_start, generate_end, train_start, train_end: train_start + 6 },
    };
  });
}

describe('report', () => {
  test('every chart renders in headless Chromium; configs and evals are shown', () => {
    const dir = makeRun('reverse-text-rl', fullMetrics(20));
    fs.mkdirSync(path.join(dir, 'configs'));
    fs.writeFileSync(
      path.join(dir, 'configs', 'rl.json'),
      JSON.stringify({
        model: { name: '/models/qwen3-tiny' },
        max_steps: 20,
        env: [{ id: 'reverse-text', args: {}, weight: 1 }],
        orchestrator: { batch_size: 128 },
        trainer: { optim: { lr: 1e-6 } },
      }),
    );
    const evalMetrics = (avg: number) => ({
      num_examples: 32,
      rollouts_per_example: 1,
      avg_at_k: avg,
      reward_std: 0.1,
      pass_at_k: null,
      completion_tokens_mean: 40,
    });
    writeEvalResults(dir, { model: 'base', step: null, environments: { 'reverse-text': evalMetrics(0.05) } });
    writeEvalResults(dir, { model: 'step_20', step: 20, environments: { 'reverse-text': evalMetrics(0.8) } });

    const file = writeReport(dir);
    expect(file).toBe(path.join(dir, 'report.html'));
    const html = fs.readFileSync(file, 'utf8');
    expect(html).not.toMatch(/(src|href)="https?:/); // self-contained: nothing to fetch
    expect(html).toContain('<h1>reverse-text-rl</h1>');
    expect(html).toContain('<dt>model</dt><dd>/models/qwen3-tiny</dd>');
    expect(html).toMatch(/<td>step_20<\/td><td class="num">1<\/td><td class="num">0\.800<\/td>/);

    const page = renderInBrowser(file);
    expect(page.expected).toBe(6);
    expect(page.rendered).toBe(6);
    expect(Object.keys(page.drawn).sort()).toEqual([
      'entropy',
      'loss',
      'mismatch_kl',
      'reward',
      'timeline',
      'tokens_per_s',
    ]);
    for (const size of Object.values(page.drawn)) expect(canvasOk(size)).toBe(true);
    expect(page.noData).toEqual([]);
  });

  test('missing fields: those charts say "no data", the others still render', () => {
    const lines = fullMetrics(6).map((l, i) => {
      const { mismatch_kl, time, reward_std, ...rest } = l as Record<string, unknown>;
      // Some lines lack a field the others have: gaps, not failures. val_loss only every 2 steps (SFT).
      if (i === 2) delete rest.entropy;
      return i % 2 === 0 ? { ...rest, val_loss: 0.3 } : rest;
    });
    const dir = makeRun('partial', lines);
    const data = loadReportData(dir);
    expect(data.charts.find((c) => c.id === 'reward')).not.toHaveProperty('band');
    const page = renderInBrowser(writeReport(dir));
    expect(page.noData.sort()).toEqual(['mismatch_kl', 'timeline']);
    expect(page.expected).toBe(4);
    expect(page.rendered).toBe(4);
    for (const size of Object.values(page.drawn)) expect(canvasOk(size)).toBe(true);
  });

  test("the header shows training's settings, not the eval section's", () => {
    // As rl.json stores them: eval (with its own envs and k) before orchestrator.
    const dir = makeRun('header', fullMetrics(2));
    fs.mkdirSync(path.join(dir, 'configs'));
    fs.writeFileSync(
      path.join(dir, 'configs', 'rl.json'),
      JSON.stringify({
        model: { name: '/models/m' },
        env: [{ id: 'reverse-text', args: {}, weight: 1 }],
        eval: { env: [{ id: 'arithmetic', args: {}, weight: 1 }], rollouts_per_example: 1 },
        orchestrator: { batch_size: 64, rollouts_per_example: 8 },
      }),
    );
    const html = fs.readFileSync(writeReport(dir), 'utf8');
    expect(html).toContain('<dt>rollouts per example</dt><dd>8</dd>');
    expect(html).toContain('<dt>environments</dt><dd>reverse-text</dd>');
    // An SFT run's environment is data.env; an eval's, its top-level env list.
    const sftDir = makeRun('header-sft', fullMetrics(2));
    fs.mkdirSync(path.join(sftDir, 'configs'));
    fs.writeFileSync(
      path.join(sftDir, 'configs', 'sft.json'),
      JSON.stringify({ model: { name: '/m' }, data: { env: { id: 'reverse-text', args: {}, weight: 1 } } }),
    );
    expect(fs.readFileSync(writeReport(sftDir), 'utf8')).toContain('<dt>environments</dt><dd>reverse-text</dd>');
    const evalDir = makeRun('header-eval', []);
    fs.mkdirSync(path.join(evalDir, 'configs'));
    fs.writeFileSync(
      path.join(evalDir, 'configs', 'eval.json'),
      JSON.stringify({ env: [{ id: 'arithmetic', args: {}, weight: 1 }], rollouts_per_example: 4 }),
    );
    const evalHtml = fs.readFileSync(writeReport(evalDir), 'utf8');
    expect(evalHtml).toContain('<dt>environments</dt><dd>arithmetic</dd>');
    expect(evalHtml).toContain('<dt>rollouts per example</dt><dd>4</dd>');
  });

  test('a run without metrics still gets a page; a missing run folder is an error', () => {
    const dir = path.join(root, 'empty');
    fs.mkdirSync(dir);
    const html = fs.readFileSync(writeReport(dir), 'utf8');
    expect(html).toContain('no steps recorded');
    expect(html.match(/class="chart no-data"/g)).toHaveLength(6);
    expect(() => writeReport(path.join(root, 'nowhere'))).toThrow(/run folder .*nowhere does not exist/);
  });
});
