/**
 * Decode benchmark of the engine (no HTTP): C sequences of P-token prompts, N new tokens each (no
 * stop), added at once and stepped to the end, as a server's batch. Per concurrency: new tokens per
 * second over the whole run (prefill included), milliseconds per decode step (a forward that
 * computes no prompt position): the call as JS sees it, the device's part (CUDA events) and the
 * host's (the rest), the bytes a decode step reads (weights, and the K/V of every running
 * sequence) against the card's bandwidth (the roofline share), and where a decode step's time goes
 * on the host (the engine's parts, native/src/generator.h StepTimes, and JS around the call).
 *
 *   npm run build:ts && node dist/bench/decode.js [--models tiny] [--device cpu] [--dtype float32]
 *     [--concurrency 1,16,64] [--prompt 128] [--new 256] [--decode-steps 1] [--threads 2]
 *     [--bandwidth-gbs N] [--eager] [--paged-kernel]
 *   ... --models qwen3-0.6b --device cuda --dtype bfloat16 --concurrency 1,64,256,1024   (a GPU machine)
 *
 * --decode-steps k: decode steps per engine call (inference.decode_steps); --eager: CUDA graphs
 * off; --paged-kernel: attention through the engine's paged decode kernel (CUDA); --bandwidth-gbs: the memory bandwidth of the roofline (default: from the GPU's name, H100
 * 3,350 GB/s, H200 4,800, A100 2,039; none on the CPU).
 */
import { execFileSync } from 'node:child_process';
import * as os from 'node:os';
import { setThreads, type CacheStats, type ComputeDType, type StepTimes } from '../native';
import { loadModel } from '../lib/model/engine';
import { loadHfModel } from '../lib/model/hf';
import { randomTokens } from '../lib/model/testing';
import { Rng } from '../lib/model/rng';
import { benchModel, QWEN3_0_6B, QWEN3_5_0_8B, TINY, type BenchShape } from './shapes';

function arg(name: string, dflt: string): string {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? process.argv[i + 1]! : dflt;
}

const MODELS: Record<string, BenchShape> = {
  tiny: TINY,
  small: { arch: 'qwen3', preset: 'small', tokenizer: 'qwen3' },
  'qwen3-0.6b': QWEN3_0_6B,
  'qwen3_5-0.8b': QWEN3_5_0_8B,
};

/** GB/s of the cards we know, by a part of their name (nvidia-smi). */
const BANDWIDTH_GBS: [RegExp, number][] = [
  [/H200/, 4800],
  [/H100/, 3350],
  [/A100/, 2039],
];

function cardBandwidth(device: string): { name: string; gbs?: number } {
  if (!device.startsWith('cuda')) return { name: 'cpu' };
  let name = 'unknown GPU';
  try {
    name = execFileSync('nvidia-smi', ['--query-gpu=name', '--format=csv,noheader'], { encoding: 'utf8' })
      .split('\n')[0]!
      .trim();
  } catch {
    /* no nvidia-smi: --bandwidth-gbs names it */
  }
  return { name, gbs: BANDWIDTH_GBS.find(([re]) => re.test(name))?.[1] };
}

const PARTS = ['plan', 'inputs', 'forward', 'attention', 'sample', 'finish', 'device'] as const;
type Part = (typeof PARTS)[number];
const diff = (a: StepTimes, b: StepTimes, k: Part | 'steps') => a[k] - b[k];

interface Row {
  model: string;
  concurrency: number;
  tokensPerSecond: number;
  stepMs: number;
  deviceMs: number;
  parts: Record<Part, number>;
  jsMs: number;
  bytesPerStep: number;
  steps: number;
}

async function main(): Promise<void> {
  const models = arg('models', 'tiny').split(',');
  const levels = arg('concurrency', '1,16,64').split(',').map(Number);
  const P = Number(arg('prompt', '128'));
  const N = Number(arg('new', '256'));
  const k = Number(arg('decode-steps', '1'));
  const device = arg('device', 'cpu');
  const dtype = arg('dtype', 'float32') as ComputeDType;
  const eager = process.argv.includes('--eager');
  const pagedAttentionKernel = process.argv.includes('--paged-kernel');
  setThreads(Number(arg('threads', String(os.cpus().length))));
  const card = cardBandwidth(device);
  const gbs = process.argv.includes('--bandwidth-gbs') ? Number(arg('bandwidth-gbs', '0')) : card.gbs;
  const rows: Row[] = [];
  for (const name of models) {
    if (!MODELS[name]) throw new Error(`--models: unknown '${name}' (known: ${Object.keys(MODELS).join(', ')})`);
    const created = benchModel(name, MODELS[name]);
    const base = loadHfModel(created.dir);
    const model = await loadModel(base.config, base.tensors, { device, dtype });
    const c = base.config;
    const elem = dtype === 'float32' ? 4 : dtype === 'float64' ? 8 : 2;
    // K/V per position in the attention blocks only (a hybrid's Gated DeltaNet blocks keep a state
    // slot per sequence instead, read and written whole each step).
    const attentionLayers = c.layerTypes ? c.layerTypes.filter((t) => t === 'full_attention').length : c.numLayers;
    const kvPerToken = 2 * attentionLayers * c.numKvHeads * c.headDim * elem;
    const rng = new Rng(0);
    for (const C of levels) {
      // One generator for the warm-up and the timed run, as a server keeps one: on CUDA the
      // warm-up runs the whole workload, so the timed run replays graphs captured before it.
      const gen = model.createGenerator({
        maxSequences: C,
        maxSequenceLength: P + N + 1,
        maxBatchedTokens: Math.max(2048, C),
        prefixSharing: 'off',
        cudaGraphs: !eager,
        pagedAttentionKernel,
      });
      const run = async (n: number, maxTokens: number) => {
        await gen.add(
          Array.from({ length: n }, (_, i) => ({ promptIds: randomTokens(rng, P, c.vocabSize), maxTokens, seed: i })),
        );
        let decodeWall = 0,
          decodeCalls = 0;
        const before = gen.stats();
        const decodeTimes: Record<Part, number> = Object.fromEntries(PARTS.map((p) => [p, 0])) as Record<Part, number>;
        let decodeSteps = 0,
          kvRead = 0;
        const t0 = process.hrtime.bigint();
        let prev: CacheStats = before;
        while (gen.stats().activeSequences > 0) {
          const s0 = process.hrtime.bigint();
          // Bytes the next step reads: every running sequence's K/V so far (and state slot).
          const cached = prev.cachedTokens;
          const stateBytes = (prev.state?.slotBytes ?? 0) * prev.runningSequences;
          await gen.step(k);
          const wall = Number(process.hrtime.bigint() - s0) / 1e6;
          const now = gen.stats();
          if (now.prefillTokens === prev.prefillTokens) {
            const steps = diff(now.times, prev.times, 'steps');
            decodeWall += wall;
            decodeCalls++;
            decodeSteps += steps;
            kvRead += steps * (cached * kvPerToken + stateBytes);
            for (const p of PARTS) decodeTimes[p] += diff(now.times, prev.times, p) * 1e3;
          }
          prev = now;
        }
        const seconds = Number(process.hrtime.bigint() - t0) / 1e9;
        return { seconds, decodeWall, decodeCalls, decodeSteps, decodeTimes, kvRead };
      };
      if (device.startsWith('cuda') && !eager) await run(C, N);
      else await run(1, 16);
      const r = await run(C, N);
      const perStep = (ms: number) => ms / Math.max(1, r.decodeSteps);
      const engineMs = PARTS.filter((p) => p !== 'device' && p !== 'attention').reduce(
        (s, p) => s + r.decodeTimes[p],
        0,
      );
      const row: Row = {
        model: `${name} (${(created.parameters / 1e6).toFixed(1)}M)`,
        concurrency: C,
        tokensPerSecond: (C * N) / r.seconds,
        stepMs: perStep(r.decodeWall),
        deviceMs: perStep(r.decodeTimes.device),
        parts: Object.fromEntries(PARTS.map((p) => [p, perStep(r.decodeTimes[p])])) as Record<Part, number>,
        jsMs: perStep(r.decodeWall - engineMs),
        // Weights (the tied embedding is read once, by the LM head) and the K/V (and states) of the batch.
        bytesPerStep: created.parameters * elem + r.kvRead / Math.max(1, r.decodeSteps),
        steps: r.decodeSteps,
      };
      rows.push(row);
      const { cudaGraphs, eagerReason } = gen.stats();
      process.stderr.write(
        `[bench] ${row.model} x${C}: ${row.tokensPerSecond.toFixed(0)} tok/s, ${row.stepMs.toFixed(2)} ms/step, ${cudaGraphs > 0 ? `${cudaGraphs} CUDA graphs` : `eager (${eagerReason})`}\n`,
      );
    }
  }
  const f = (x: number, d = 2) => x.toFixed(d);
  const onCuda = device.startsWith('cuda');
  process.stdout.write(
    [
      `Machine: ${onCuda ? card.name : `${os.cpus().length} x ${os.cpus()[0]!.model}`}; ${dtype}; prompts of ${P} tokens, ${N} new tokens each; ${k} decode step(s) per call${eager ? '; CUDA graphs off' : ''}; attention: ${pagedAttentionKernel ? 'the paged decode kernel' : onCuda || dtype === 'bfloat16' ? "libtorch's matmuls over gathered blocks" : "the CPU's kernel, over the blocks in place"}.`,
      '',
      `| model | concurrency | tokens/s | ms per decode step | device ms | host ms | bytes read per step | roofline share${gbs ? ` (${gbs} GB/s)` : ''} |`,
      '| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |',
      ...rows.map((r) => {
        const host = onCuda ? f(r.stepMs - r.deviceMs) : f(r.stepMs);
        const share = gbs ? `${f((100 * r.bytesPerStep) / (gbs * 1e9 * (r.stepMs / 1e3)), 1)}%` : '-';
        return `| ${r.model} | ${r.concurrency} | ${f(r.tokensPerSecond, 0)} | ${f(r.stepMs)} | ${onCuda ? f(r.deviceMs) : '-'} | ${host} | ${(r.bytesPerStep / 1e6).toFixed(1)} MB | ${share} |`;
      }),
      '',
      'A decode step on the host, ms (the engine\'s parts; "JS" = the call as JS saw it less those parts):',
      '',
      '| model | concurrency | plan | inputs | forward | of which attention | sample | finish | JS |',
      '| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |',
      ...rows.map(
        (r) =>
          `| ${r.model} | ${r.concurrency} | ${f(r.parts.plan, 3)} | ${f(r.parts.inputs, 3)} | ${f(r.parts.forward, 3)} | ${onCuda ? '-' : f(r.parts.attention, 3)} | ${f(r.parts.sample, 3)} | ${f(r.parts.finish, 3)} | ${f(r.jsMs, 3)} |`,
      ),
      '',
    ].join('\n'),
  );
}

main().catch((e) => {
  process.stderr.write(`${(e as Error).stack}\n`);
  process.exit(1);
});
