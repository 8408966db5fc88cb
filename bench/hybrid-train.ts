/**
 * The reverse-text example's SFT step on its Qwen3.5 (hybrid) model against the same example's
 * Qwen3: the models `examples/reverse_text/run.sh` creates (width 128, intermediate 384, 4 blocks of
 * 8 heads, byte tokenizer; `--arch qwen3_5`: blocks 1-3 Gated DeltaNet, block 4 gated full
 * attention), trained on rows shaped like `configs/reverse_text/sft.toml`'s batches (32 samples of
 * ~160 tokens, three to a row: 11 rows of 3 x 160, the loss on each sample's last 40 tokens), fp32.
 * Each model in its own process, alternating in rounds, so a shared machine's load falls on both;
 * with --baseline-addon, that build of the addon (e.g. main's) runs each model too, before ours.
 *
 *   node dist/bench/hybrid-train.js [--rounds 3] [--steps 5] [--threads 2] [--archs qwen3,qwen3_5]
 *     [--baseline-addon <prime_native.node>] [--profile <dir>]
 *
 * One line per process and a table of medians (wall and CPU ms a step; the ratio of Qwen3.5 to
 * Qwen3 in the same build). Under load compare CPU times, at --threads 1 (no threads spinning). --profile <dir>: one more step of each model under the profiler (ours only):
 * <dir>/<arch>.txt and .json (native/src/profile.h).
 */
import { spawnSync } from 'node:child_process';
import * as os from 'node:os';
import * as path from 'node:path';
import { setThreads } from '../native';
import { loadModel } from '../lib/model/engine';
import { loadHfModel } from '../lib/model/hf';
import { benchModel, type BenchShape } from './shapes';
import { timeTraining } from './train-bench';

/** examples/reverse_text/run.sh's `model create` flags. */
const REVERSE_TEXT: BenchShape = {
  arch: 'qwen3',
  preset: 'tiny',
  tokenizer: 'bytes',
  hiddenSize: 128,
  intermediateSize: 384,
  numLayers: 4,
  numHeads: 8,
  numKvHeads: 8,
  maxPositionEmbeddings: 512,
};
const ARCHS = ['qwen3', 'qwen3_5'] as const;
type BenchArch = (typeof ARCHS)[number];
// The SFT batch's shape (see above).
const ROWS = 11,
  SAMPLES = 3,
  SAMPLE_LEN = 160,
  LOSS_TOKENS = 40;

function arg(name: string, dflt: string): string {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? process.argv[i + 1]! : dflt;
}
function intArg(name: string, dflt: number): number {
  const v = Number(arg(name, String(dflt)));
  if (!Number.isInteger(v) || v < 1) {
    console.error(`hybrid-train: --${name} must be a positive integer, not '${arg(name, '')}'`);
    process.exit(2);
  }
  return v;
}

interface StepTime {
  /** Wall seconds a step (the mean of the timed steps). */
  step: number;
  /** CPU seconds a step, all threads (the figure to compare under load; with --threads 1 it holds no spinning). */
  cpu: number;
  /** The last step's forward + backward and optimizer seconds. */
  forwardBackward: number;
  optimizer: number;
}

/** One model's steps, in this (child) process. */
async function child(arch: BenchArch, steps: number, profile: string | undefined): Promise<StepTime> {
  const created = benchModel(`reverse-text-${arch}`, { ...REVERSE_TEXT, arch });
  const base = loadHfModel(created.dir);
  const model = await loadModel(base.config, base.tensors, { device: 'cpu', dtype: 'float32' });
  const t = await timeTraining(model, {
    vocab: base.config.vocabSize,
    rows: ROWS,
    rowLen: SAMPLES * SAMPLE_LEN,
    samples: SAMPLES,
    lossFrom: SAMPLE_LEN - LOSS_TOKENS,
    steps,
    mixed: false,
    profile: profile ? path.join(profile, arch) : undefined,
  });
  return {
    step: t.seconds / steps,
    cpu: t.cpuSeconds / steps,
    forwardBackward: t.last?.forwardBackwardSeconds ?? NaN,
    optimizer: t.last?.optimizerSeconds ?? NaN,
  };
}

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;
const ms = (s: number) => (s * 1e3).toFixed(0);

async function main(): Promise<void> {
  const steps = intArg('steps', 5);
  const threads = intArg('threads', Math.min(2, os.cpus().length));
  const childArch = arg('child', '');
  if (childArch) {
    setThreads(threads);
    const profile = process.argv.includes('--profile') ? path.resolve(arg('profile', '')) : undefined;
    process.stdout.write(JSON.stringify(await child(childArch as BenchArch, steps, profile)) + '\n');
    return;
  }
  const archs = arg('archs', ARCHS.join(',')).split(',');
  for (const a of archs)
    if (!(ARCHS as readonly string[]).includes(a)) {
      console.error(`hybrid-train: --archs takes ${ARCHS.join(', ')}, not '${a}'`);
      process.exit(2);
    }
  const rounds = intArg('rounds', 3);
  const baseline = process.argv.includes('--baseline-addon') ? path.resolve(arg('baseline-addon', '')) : null;
  const builds: [string, NodeJS.ProcessEnv][] = [
    ...(baseline
      ? [['baseline', { ...process.env, PRIME_NATIVE_ADDON: baseline }] as [string, NodeJS.ProcessEnv]]
      : []),
    ['ours', { ...process.env, PRIME_NATIVE_ADDON: '' }],
  ];
  const times = new Map<string, number[]>();
  for (let r = 0; r < rounds; r++)
    for (const arch of archs)
      for (const [build, env] of builds) {
        const args = [__filename, '--child', arch, '--steps', String(steps), '--threads', String(threads)];
        // The profile: ours, once, after the last round's timed steps.
        if (build === 'ours' && r === rounds - 1 && process.argv.includes('--profile'))
          args.push('--profile', arg('profile', ''));
        const run = spawnSync(process.execPath, args, { env, encoding: 'utf8' });
        if (run.status !== 0) {
          console.error(`hybrid-train: ${build} ${arch} failed:\n${run.stderr}`);
          process.exit(1);
        }
        const t = JSON.parse(run.stdout.trim().split('\n').pop()!) as StepTime;
        const load = os.loadavg()[0]!.toFixed(1);
        console.error(
          `[round ${r + 1}] ${build} ${arch}: ${ms(t.step)} ms a step, CPU ${ms(t.cpu)} ms (last step: forward + backward ${ms(t.forwardBackward)}, optimizer ${ms(t.optimizer)}), load ${load}`,
        );
        for (const [what, v] of [
          ['wall', t.step],
          ['cpu', t.cpu],
        ] as const) {
          const key = `${build} ${arch} ${what}`;
          times.set(key, [...(times.get(key) ?? []), v]);
        }
      }
  console.log(
    `\nreverse-text SFT step, ${ROWS} rows of ${SAMPLES} x ${SAMPLE_LEN} tokens, fp32, ${threads} threads, median of ${rounds} rounds of ${steps} steps\n`,
  );
  const m = (build: string, arch: string, what: string) => median(times.get(`${build} ${arch} ${what}`)!);
  console.log('| build | ' + archs.map((a) => `${a} ms a step (CPU ms)`).join(' | ') + ' | qwen3_5 / qwen3 (CPU) |');
  console.log('| --- | ' + archs.map(() => '---:').join(' | ') + ' | ---: |');
  for (const [build] of builds) {
    const cells = archs.map((a) => `${ms(m(build, a, 'wall'))} (${ms(m(build, a, 'cpu'))})`);
    const ratio = (what: string) => (m(build, 'qwen3_5', what) / m(build, 'qwen3', what)).toFixed(2);
    console.log(
      `| ${build} | ${cells.join(' | ')} | ${archs.length === 2 ? `${ratio('wall')} (${ratio('cpu')})` : '-'} |`,
    );
  }
  if (baseline)
    for (const a of archs) {
      const ratio = (what: string) => (m('baseline', a, what) / m('ours', a, what)).toFixed(2);
      console.log(`${a}: baseline / ours ${ratio('wall')}x wall, ${ratio('cpu')}x CPU`);
    }
}

main().catch((e: unknown) => {
  console.error(e);
  process.exit(1);
});
