/**
 * The RL loop at size on one device (issue #38): `prime-rl rl @ configs/gpu/rl-0.6b.toml` as a user
 * runs it, a Qwen3-0.6B-shaped model (random weights, the Qwen3 tokenizer) with trainer and
 * inference sharing the card, reverse-text prompts, 128 rollouts a step of up to 128 tokens,
 * async_level 1 in in-flight mode, 30 steps. Prints each step's time split into its parts, as
 * medians over the steps after the first two (warm-up), and writes the same to --out:
 *
 *   step          between consecutive train-step ends
 *   generation    the inference server's busy time for the step: in in-flight mode it generates
 *                 continuously, so the step's time less the producer's idle time
 *                 (inference_idle_seconds); in strict mode the step's generate_seconds
 *   training      the trainer's own time: batch load, forward + backward + optimizer, weights write
 *   weight update from the step's end to the inference server serving the weights it wrote (the
 *                 server's /health, polled every 100 ms)
 *   orchestration step - (max(generation, training) + weight update): what the overlap of
 *                 generation and training does not explain (issue #38: at most 10% of the step)
 *   waiting       how long the step waited for its rollouts (in-flight mode: generate_seconds is the
 *                 claim's wait), a part of the critical path
 * and each role's tokens/s and peak memory: on CUDA what nvidia-smi reports for the role's process
 * (its caching allocator's reserve included), on the CPU the process's peak RSS.
 *
 *   node dist/bench/rl-size.js [--device cuda|cpu] [--steps 30] [--model DIR] [--fused-kernels] [--out FILE]
 *     [--batch-size 128] [--max-tokens 128]
 *
 * --device cpu runs the same config shape with the tiny preset and the byte tokenizer (a Qwen3
 * vocabulary's LM head would make each CPU step minutes long), fp32, one thread per role: the
 * end-to-end check that the configuration works without a GPU. --fused-kernels turns
 * trainer.model.fused_kernels on. --batch-size and --max-tokens override the config's rollouts a
 * step and their length (a quicker run; the GPU plan's dry run takes 16 of 16 tokens).
 */
import { execFileSync, spawn } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { readLauncherRecord } from '../lib/launch/supervise';
import { freePort } from '../lib/net';
import { readStepMetrics, type StepRecord } from '../lib/runfolder/metrics';
import { RunLayout } from '../lib/runfolder/layout';
import { benchModel, QWEN3_0_6B, TINY } from './shapes';

const ROOT = path.resolve(__dirname, '..', '..');
const CONFIG = path.join(ROOT, 'configs', 'gpu', 'rl-0.6b.toml');
const WARMUP_STEPS = 2;

function arg(name: string, dflt: string): string {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? process.argv[i + 1]! : dflt;
}
const median = (xs: number[]) => {
  const s = xs.filter(Number.isFinite).sort((a, b) => a - b);
  return s.length === 0 ? NaN : s.length % 2 ? s[(s.length - 1) / 2]! : (s[s.length / 2 - 1]! + s[s.length / 2]!) / 2;
};
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

/** The card's memory in use, in bytes (nvidia-smi), or 0. */
function deviceMemoryUsed(): number {
  try {
    const csv = execFileSync('nvidia-smi', ['--query-gpu=memory.used', '--format=csv,noheader,nounits'], {
      encoding: 'utf8',
      timeout: 5000,
    });
    return Number(csv.trim().split('\n')[0]) * 2 ** 20 || 0;
  } catch {
    return 0;
  }
}

/** Memory of a process by pid, in bytes: GPU memory (nvidia-smi) on CUDA, peak RSS on the CPU. */
function memoryOf(pids: number[], cuda: boolean): Map<number, number> {
  const out = new Map<number, number>();
  if (cuda) {
    try {
      const csv = execFileSync(
        'nvidia-smi',
        ['--query-compute-apps=pid,used_memory', '--format=csv,noheader,nounits'],
        { encoding: 'utf8', timeout: 5000 },
      );
      for (const line of csv.trim().split('\n')) {
        const [pid, mib] = line.split(',').map((x) => Number(x.trim()));
        if (pids.includes(pid!)) out.set(pid!, (out.get(pid!) ?? 0) + mib! * 2 ** 20);
      }
    } catch {
      // nvidia-smi missing or failing: no device memory figures (the table says so)
    }
    return out;
  }
  for (const pid of pids) {
    try {
      const hwm = /VmHWM:\s+(\d+) kB/.exec(fs.readFileSync(`/proc/${pid}/status`, 'utf8'));
      if (hwm) out.set(pid, Number(hwm[1]) * 1024);
    } catch {
      // the process has exited
    }
  }
  return out;
}

async function main() {
  const device = arg('device', 'cuda');
  if (!/^(cpu|cuda(:\d+)?)$/.test(device)) throw new Error(`--device: cpu, cuda or cuda:N, not '${device}'`);
  const cuda = device !== 'cpu';
  const steps = Number(arg('steps', '30'));
  if (!(Number.isInteger(steps) && steps > WARMUP_STEPS + 1))
    throw new Error(`--steps: an integer above ${WARMUP_STEPS + 1}`);
  const root = fs.mkdtempSync(path.join(os.tmpdir(), 'prime-bench-rl-size-'));
  const model = process.argv.includes('--model')
    ? path.resolve(arg('model', ''))
    : cuda
      ? benchModel('qwen3-0.6b', QWEN3_0_6B).dir
      : benchModel('tiny', TINY).dir;
  const [port, uiPort, inferencePort] = [await freePort(), await freePort(), await freePort()];
  const outputDir = path.join(root, 'outputs');
  const runName = 'rl-size';
  const layout = RunLayout.of(outputDir, runName);
  const args = [
    path.join(ROOT, 'bin', 'prime-rl.js'),
    'rl',
    '@',
    CONFIG,
    ...['--model.name', model, '--run-name', runName, '--output-dir', outputDir, '--max-steps', String(steps)],
    ...['--temporal.port', `${port}`, '--temporal.ui-port', `${uiPort}`, '--inference.server.port', `${inferencePort}`],
    ...['--trainer.model.device', device, '--inference.model.device', device],
    ...(cuda
      ? []
      : [
          ...['--trainer.model.dtype', 'float32', '--inference.model.dtype', 'float32'],
          ...['--trainer.threads', '1', '--inference.threads', '1'],
        ]),
    ...(process.argv.includes('--fused-kernels') ? ['--trainer.model.fused-kernels', 'true'] : []),
    ...(process.argv.includes('--batch-size') ? ['--orchestrator.batch-size', arg('batch-size', '')] : []),
    ...(process.argv.includes('--max-tokens') ? ['--orchestrator.sampling.max-tokens', arg('max-tokens', '')] : []),
  ];
  const log = path.join(root, 'rl.log');
  process.stderr.write(`rl-size: ${steps} steps on ${device}, model ${model}, log ${log}\n`);
  const fd = fs.openSync(log, 'a');
  const child = spawn(process.execPath, args, { cwd: ROOT, stdio: ['ignore', fd, fd] });
  fs.closeSync(fd);
  let exitCode: number | null = null;
  const exited = new Promise<void>((resolve) =>
    child.on('exit', (code, signal) => {
      exitCode = code ?? (signal ? 128 : 1);
      resolve();
    }),
  );

  // While it runs: when the server first serves each policy version, and each role's peak memory.
  const served = new Map<number, number>();
  // Where nvidia-smi cannot see the processes (another PID namespace), the card's total is kept.
  const peak = { inference: 0, trainer: 0, card: 0 };
  const t0 = Date.now();
  let lastMemory = 0;
  while (exitCode === null) {
    try {
      const res = await fetch(`http://127.0.0.1:${inferencePort}/health`, { signal: AbortSignal.timeout(1000) });
      const v = ((await res.json()) as { policy_version?: number }).policy_version;
      if (typeof v === 'number' && !served.has(v)) served.set(v, Date.now() / 1000);
    } catch {
      // not up yet, or busy: the next poll
    }
    if (Date.now() - lastMemory >= 1000) {
      lastMemory = Date.now();
      const rec = fs.existsSync(layout.launcherFile) ? readLauncherRecord(layout) : undefined;
      const pids = { inference: rec?.processes.inference?.pid, trainer: rec?.processes.trainer?.pid };
      const mem = memoryOf(
        [pids.inference, pids.trainer].filter((p): p is number => p !== undefined),
        cuda,
      );
      for (const role of ['inference', 'trainer'] as const) {
        const p = pids[role];
        if (p !== undefined) peak[role] = Math.max(peak[role], mem.get(p) ?? 0);
      }
      if (cuda) peak.card = Math.max(peak.card, deviceMemoryUsed());
    }
    await Promise.race([exited, sleep(100)]);
  }
  const wall = (Date.now() - t0) / 1000;
  const records = readStepMetrics(layout.metricsFile);
  if (exitCode !== 0 || records.length < steps)
    throw new Error(`rl exited ${exitCode} with ${records.length}/${steps} steps in metrics.jsonl (log: ${log})`);

  type Times = { train_end: number };
  const trainEnd = (r: StepRecord) => (r.time as Times).train_end;
  const rows = records.slice(WARMUP_STEPS + 1).map((r, i) => {
    const prev = records[WARMUP_STEPS + i]!;
    const s = r.seconds as Record<string, number>;
    const step = trainEnd(r) - trainEnd(prev);
    // In-flight mode: generation runs beside the steps; its busy time is the step less its idle time.
    const idle = r.inference_idle_seconds;
    const generation = typeof idle === 'number' ? step - idle : Number(r.generate_seconds);
    const training = Object.values(s).reduce((a, b) => a + b, 0);
    // Step n writes the weights of policy version n + 1.
    const seen = served.get(r.step + 1);
    const update = seen === undefined ? NaN : seen - trainEnd(r);
    return {
      step,
      generation,
      training,
      update,
      orchestration: step - (Math.max(generation, training) + (Number.isFinite(update) ? update : 0)),
      waiting: Number(r.generate_seconds),
      genTokS: Number(r.completion_tokens) / generation,
      trainTokS: Number(r.tokens_per_s),
    };
  });
  const m = (k: keyof (typeof rows)[number]) => median(rows.map((r) => r[k]));
  const s = (x: number) => (Number.isFinite(x) ? x.toFixed(2) : 'n/a');
  const gb = (b: number) => (b > 0 ? (b / 1e9).toFixed(2) : 'n/a');
  const bound =
    m('step') / (Math.max(m('generation'), m('training')) + (Number.isFinite(m('update')) ? m('update') : 0));
  const table = [
    `RL at size on ${device}: ${path.basename(CONFIG)}, ${steps} steps in ${wall.toFixed(0)} s, medians over steps ${WARMUP_STEPS + 1}..${steps - 1}`,
    '',
    '| part | seconds | share of the step |',
    '| --- | ---: | ---: |',
    ...(['step', 'generation', 'training', 'update', 'orchestration', 'waiting'] as const).map(
      (k) =>
        `| ${k === 'update' ? 'weight update' : k === 'waiting' ? 'trainer waiting for rollouts' : k} | ${s(m(k))} | ${((m(k) / m('step')) * 100).toFixed(0)}% |`,
    ),
    '',
    `step / (max(generation, training) + weight update): ${s(bound)} (issue #38: at most 1.10)`,
    '',
    '| role | tokens/s | peak memory (GB) |',
    '| --- | ---: | ---: |',
    `| inference (completion tokens over its busy time) | ${m('genTokS').toFixed(0)} | ${gb(peak.inference)} |`,
    `| trainer (trained tokens) | ${m('trainTokS').toFixed(0)} | ${gb(peak.trainer)} |`,
    '',
    `Peak memory: ${cuda ? `the role's process as nvidia-smi reports it (allocator reserve included); the whole card's peak ${gb(peak.card)} GB` : 'peak RSS'}.`,
  ].join('\n');
  console.log(table);
  const out = process.argv.includes('--out') ? arg('out', '') : '';
  if (out) fs.writeFileSync(out, table + '\n');
  fs.rmSync(root, { recursive: true, force: true });
}

main().catch((e: unknown) => {
  console.error(e);
  process.exit(1);
});
