/**
 * Decode of a hybrid model against transformers and against a dense model of its size, at a short
 * and a long prompt (issue #46): Qwen3.5-0.8B's shape (random weights, the 248,320-token
 * vocabulary; Gated DeltaNet blocks keep a fixed-size state per sequence, one block in four keeps
 * K/V) against Hugging Face transformers on the same folder (its torch fallback of the delta rule,
 * bench/hybrid_decode_torch.py) and against our Qwen3-0.6B shape, in one run, fp32 on the CPU.
 *
 *   npm run build:ts && node dist/bench/hybrid-decode.js [--models qwen3_5-0.8b,qwen3-0.6b]
 *     [--prompts 128,4096] [--batches 1,64,256] [--steps 8] [--warmup 1] [--budget-gib 16]
 *     [--limit-gib N] [--threads 2] [--python PATH] [--no-peer] [--tiny]
 *
 * The workload, feasible on a 2-core CPU: every sequence of a batch continues the same prompt.
 * Distinct 4,096-token prompts for 256 sequences would be a million prefill tokens (hours here)
 * and more K/V than the machine holds; decode reads each sequence's whole context either way, so
 * one shared prompt costs the decode step what distinct ones would. Per model and prompt length P:
 * the prompt is prefilled once at batch 1 (its time reported apart); per batch B, B sequences
 * continue it (ours: the prefix cache's blocks and state snapshot, the rest of the last block
 * computed once for the group, and each sequence's state slot a copy; transformers: the batch-1
 * cache repeated to B rows), then --warmup untimed and --steps timed decode steps, each a forward
 * of one token per sequence and sampling at temperature 1. tokens/s = B x steps / their wall time.
 *
 * The memory side, per model: the bytes a sequence holds (ours: a state slot, the engine's own
 * `slotBytes`, plus its K/V blocks, KvBlocks::blockBytes; transformers: measured from its cache's
 * tensors), and how many sequences of distinct P-token prompts fit in --budget-gib of cache (16 GiB)
 * at each prompt length. A configuration whose cache (and logits) would pass --limit-gib (default:
 * 80% of the memory free at the start, less the weights) is skipped and the table says so.
 * --tiny: the same run on tiny models (Qwen3.5 and Qwen3 of the tiny preset, byte tokenizer), so
 * every configuration is checked to run in a minute.
 */
import { spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { setThreads } from '../native';
import { loadModel } from '../lib/model/engine';
import { loadHfModel } from '../lib/model/hf';
import { randomTokens } from '../lib/model/testing';
import { Rng } from '../lib/model/rng';
import { benchModel, QWEN3_0_6B, QWEN3_5_0_8B, TINY, TINY_QWEN3_5, type BenchShape } from './shapes';

const ROOT = path.resolve(__dirname, '..', '..');
const GIB = 2 ** 30;
const BLOCK = 16; // the generator's default blockSize, used here

function arg(name: string, dflt: string): string {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? process.argv[i + 1]! : dflt;
}
const list = (name: string, dflt: string) => arg(name, dflt).split(',').map(Number);

const MODELS: Record<string, BenchShape> = {
  'qwen3_5-0.8b': QWEN3_5_0_8B,
  'qwen3-0.6b': QWEN3_0_6B,
  'qwen3_5-tiny': TINY_QWEN3_5,
  'qwen3-tiny': TINY,
};
/** --tiny: each model's stand-in. */
const TINY_OF: Record<string, string> = { 'qwen3_5-0.8b': 'qwen3_5-tiny', 'qwen3-0.6b': 'qwen3-tiny' };

interface Run {
  model: string;
  engine: 'ours' | 'transformers';
  prompt: number;
  batch: number;
  prefillSeconds: number;
  /** CPU time of the process (all its threads) over the prefill, and per decode step. */
  prefillCpuSeconds: number;
  stepMs?: number;
  cpuMsPerStep?: number;
  tokensPerSecond?: number;
  /** Ours: the cache the running batch held (blocks in use and state slots in use), bytes. */
  cacheBytes?: number;
  /** Ours: prompt positions computed to start the batch (the rest of the shared prompt's last block). */
  recomputed?: number;
  skipped?: string;
}

interface Memory {
  model: string;
  engine: 'ours' | 'transformers';
  stateBytes: number;
  kvBytesPerToken: number;
  /** Bytes of one sequence holding `prompt` positions. */
  perSequence: (prompt: number) => number;
}

interface Settings {
  prompts: number[];
  batches: number[];
  steps: number;
  warmup: number;
  /** Bytes a configuration's cache and logits may take (weights apart). */
  limit: number;
}

const isHybrid = (shape: BenchShape) => shape.arch.startsWith('qwen3_5');

/** The transformers side on one model folder (bench/hybrid_decode_torch.py in a process of its own). */
function peer(python: string, label: string, dir: string, s: Settings, threads: number) {
  const script = path.join(ROOT, 'bench', 'hybrid_decode_torch.py');
  const args = [script, dir, s.prompts.join(','), s.batches.join(','), String(s.steps), String(s.warmup)];
  const run = spawnSync(python, [...args, String(Math.floor(s.limit)), String(threads)], {
    encoding: 'utf8',
    maxBuffer: 64 << 20,
  });
  const lines = (run.stdout ?? '').split('\n').filter((l) => l.startsWith('{'));
  if (run.status !== 0) throw new Error(`${python} ${script} failed (${run.status}): ${run.stderr?.slice(-2000)}`);
  const parsed = lines.map((l) => JSON.parse(l) as Record<string, unknown>);
  const last = parsed.pop() as { versions: Record<string, string>; peakRssMb: number };
  const rows = parsed as unknown as (Run & { stateBytes: number; kvBytesPerToken: number })[];
  const runs: Run[] = rows.map((r) => ({ ...r, model: label, engine: 'transformers' }));
  const memory: Memory = {
    model: label,
    engine: 'transformers',
    stateBytes: rows[0]!.stateBytes,
    kvBytesPerToken: rows[0]!.kvBytesPerToken,
    perSequence: (p) => rows[0]!.stateBytes + p * rows[0]!.kvBytesPerToken,
  };
  return { runs, memory, versions: last.versions, peakRssMb: last.peakRssMb };
}

/** Our engine on one model: per prompt length, one generator (prefix cache on), the batches in turn. */
async function ours(label: string, dir: string, s: Settings, rng: Rng) {
  const base = loadHfModel(dir);
  const c = base.config;
  const model = await loadModel(c, base.tensors, { device: 'cpu', dtype: 'float32' });
  const hybrid = (c.layerTypes ?? []).includes('linear_attention');
  // KvBlocks::blockBytes: K and V of the full-attention blocks only, fp32.
  const attentionLayers = c.layerTypes ? c.layerTypes.filter((t) => t === 'full_attention').length : c.numLayers;
  const blockBytes = 2 * attentionLayers * BLOCK * c.numKvHeads * c.headDim * 4;
  const slotBytes = hybrid
    ? model.createGenerator({ maxSequences: 1, maxSequenceLength: 2 * BLOCK, stateSlots: 1 }).stats().state!.slotBytes
    : 0;
  const memory: Memory = {
    model: label,
    engine: 'ours',
    stateBytes: slotBytes,
    kvBytesPerToken: blockBytes / BLOCK,
    perSequence: (p) => slotBytes + Math.ceil(p / BLOCK) * blockBytes,
  };
  // Positions each sequence may add to the prompt: its first token, the warm-up and the timed steps,
  // and a block more, as a group's sequences may take their first tokens in different steps (the
  // timed steps are those after every one has its first; the rest are removed after them).
  const tail = 1 + s.warmup + s.steps + BLOCK;
  const runs: Run[] = [];
  for (const P of s.prompts) {
    // The shared prompt's blocks, and per sequence its own: a copy of the partial last one, the tail's.
    const kvTokens = (B: number) => (Math.ceil(P / BLOCK) + B * (Math.ceil(tail / BLOCK) + 2)) * BLOCK;
    const need = (B: number) => (kvTokens(B) / BLOCK) * blockBytes + (B + 2) * slotBytes + 2 * B * c.vocabSize * 4;
    const fit = s.batches.filter((B) => need(B) <= s.limit);
    for (const B of s.batches.filter((b) => !fit.includes(b)))
      runs.push({
        model: label,
        engine: 'ours',
        prompt: P,
        batch: B,
        prefillSeconds: NaN,
        prefillCpuSeconds: NaN,
        skipped: tooBig(need(B), s.limit),
      });
    if (!fit.length) continue;
    const maxB = Math.max(...fit);
    const gen = model.createGenerator({
      maxSequences: maxB,
      maxSequenceLength: P + tail + 1,
      kvCacheTokens: kvTokens(maxB),
      maxBatchedTokens: Math.max(2048, maxB),
      prefixSharing: 'cache',
      ...(hybrid ? { stateSlots: maxB + 2 } : {}),
    });
    const prompt = randomTokens(rng, P, c.vocabSize);
    const t0 = process.hrtime.bigint(),
      c0 = process.cpuUsage();
    await gen.add([{ promptIds: prompt, maxTokens: 1, seed: 0 }]);
    while (gen.stats().activeSequences > 0) await gen.step();
    const prefillSeconds = Number(process.hrtime.bigint() - t0) / 1e9,
      prefillCpuSeconds = cpuSeconds(c0);
    for (const B of fit) {
      const before = gen.stats();
      const added = await gen.add(
        Array.from({ length: B }, (_, i) => ({ promptIds: prompt, maxTokens: tail, seed: i + 1 })),
      );
      if (added.length !== B) throw new Error(`${label}: ${added.length} of ${B} sequences admitted (cache sizing)`);
      const started = new Set<number>();
      while (started.size < B) for (const t of await gen.step()) started.add(t.seqId);
      for (let i = 0; i < s.warmup; i++) await gen.step();
      const running = gen.stats();
      let wall = 0;
      const c1 = process.cpuUsage();
      for (let i = 0; i < s.steps; i++) {
        const t = process.hrtime.bigint();
        const tokens = await gen.step();
        wall += Number(process.hrtime.bigint() - t) / 1e9;
        if (tokens.length !== B) throw new Error(`${label}: a decode step gave ${tokens.length} tokens, not ${B}`);
      }
      const cpu = cpuSeconds(c1);
      await gen.remove(added.map((a) => a.seqId));
      const after = gen.stats();
      if (after.activeSequences !== 0 || after.preemptions !== before.preemptions)
        throw new Error(`${label}: ${after.activeSequences} sequences left, ${after.preemptions} preemptions`);
      runs.push({
        model: label,
        engine: 'ours',
        prompt: P,
        batch: B,
        prefillSeconds,
        prefillCpuSeconds,
        stepMs: (1e3 * wall) / s.steps,
        cpuMsPerStep: (1e3 * cpu) / s.steps,
        tokensPerSecond: (B * s.steps) / wall,
        cacheBytes: running.blocksInUse * blockBytes + (running.state?.inUse ?? 0) * slotBytes,
        recomputed: running.prefillTokens - before.prefillTokens,
      });
      process.stderr.write(`[bench] ours ${label} P=${P} B=${B}: ${runs.at(-1)!.tokensPerSecond!.toFixed(1)} tok/s\n`);
    }
  }
  return { runs, memory };
}

/** CPU seconds of this process (every thread) since `from`. */
function cpuSeconds(from: NodeJS.CpuUsage): number {
  const d = process.cpuUsage(from);
  return (d.user + d.system) / 1e6;
}

const tooBig = (need: number, limit: number) =>
  `needs ${(need / GIB).toFixed(1)} GiB of cache and logits, over the ${(limit / GIB).toFixed(1)} GiB limit`;

async function main(): Promise<void> {
  const tiny = process.argv.includes('--tiny');
  const names = arg('models', 'qwen3_5-0.8b,qwen3-0.6b')
    .split(',')
    .map((n) => (tiny ? (TINY_OF[n] ?? n) : n));
  for (const n of names)
    if (!MODELS[n]) throw new Error(`--models: unknown '${n}' (known: ${Object.keys(MODELS).join(', ')})`);
  const threads = Number(arg('threads', '2'));
  setThreads(threads);
  const budget = Number(arg('budget-gib', '16')) * GIB;
  const free = process.argv.includes('--limit-gib') ? Number(arg('limit-gib', '0')) * GIB : 0.8 * os.freemem();
  const python = arg('python', path.join(ROOT, 'build', 'bench-venv', 'bin', 'python'));
  const withPeer = !process.argv.includes('--no-peer');
  if (withPeer && !fs.existsSync(python))
    throw new Error(
      `--python: ${python} does not exist (npm run bench:compare creates build/bench-venv; or name a python with torch and transformers 5.x)`,
    );
  const base = { prompts: list('prompts', '128,4096'), batches: list('batches', '1,64,256') };
  const steps = Number(arg('steps', '8')),
    warmup = Number(arg('warmup', '1'));
  const load0 = os.loadavg();
  const runs: Run[] = [];
  const memory: Memory[] = [];
  const notes: string[] = [];
  const models: { name: string; params: number }[] = [];
  const rng = new Rng(0);
  for (const name of names) {
    const created = benchModel(name, MODELS[name]!);
    models.push({ name, params: created.parameters });
    // The weights (fp32) stay outside what the cache may take.
    const s: Settings = { ...base, steps, warmup, limit: free - created.parameters * 4 };
    if (withPeer && isHybrid(MODELS[name]!)) {
      const p = peer(python, name, created.dir, s, threads);
      runs.push(...p.runs);
      memory.push(p.memory);
      notes.push(
        `transformers ${p.versions.transformers}, torch ${p.versions.torch} (peak RSS ${p.peakRssMb.toFixed(0)} MB on ${name})`,
      );
    }
    const o = await ours(name, created.dir, s, rng);
    runs.push(...o.runs);
    memory.push(o.memory);
  }
  const load1 = os.loadavg();
  const f = (x: number | undefined, d = 2) => (x === undefined || Number.isNaN(x) ? '-' : x.toFixed(d));
  const mb = (x: number | undefined) => (x === undefined ? '-' : (x / 1e6).toFixed(1));
  const find = (model: string, engine: string, P: number, B: number) =>
    runs.find((r) => r.model === model && r.engine === engine && r.prompt === P && r.batch === B && !r.skipped);
  // tokens/s, and CPU time per step (theirs / ours: a ratio a loaded machine moves less, as a
  // process waiting for a core spends none).
  const ratio = (a?: Run, b?: Run) =>
    a && b
      ? `${(a.tokensPerSecond! / b.tokensPerSecond!).toFixed(2)}x (CPU ${(b.cpuMsPerStep! / a.cpuMsPerStep!).toFixed(2)}x)`
      : '-';
  const hybridName = names.find((n) => isHybrid(MODELS[n]!));
  const denseName = names.find((n) => !isHybrid(MODELS[n]!));
  const out = [
    `Machine: ${os.cpus().length} x ${os.cpus()[0]!.model}, ${threads} threads, fp32; load average ${load0.map((l) => l.toFixed(1)).join(' ')} at the start, ${load1.map((l) => l.toFixed(1)).join(' ')} at the end.`,
    `Models: ${models.map((m) => `${m.name} (${(m.params / 1e6).toFixed(1)}M parameters)`).join(', ')}. ${notes.join('; ') || 'No transformers run.'}`,
    `Every sequence of a batch continues one random prompt, prefilled once at batch 1; ${warmup} warm-up and ${steps} timed decode steps per batch.`,
    '',
    '| prompt | batch | model | engine | prefill at batch 1: s (CPU s) | ms per decode step (CPU ms) | tokens/s | cache held (MB) |',
    '| ---: | ---: | --- | --- | ---: | ---: | ---: | ---: |',
    ...runs.map((r) => {
      const head = `| ${r.prompt} | ${r.batch} | ${r.model} | ${r.engine} | ${f(r.prefillSeconds)} (${f(r.prefillCpuSeconds)})`;
      return r.skipped
        ? `${head} | skipped: ${r.skipped} | - | - |`
        : `${head} | ${f(r.stepMs, 1)} (${f(r.cpuMsPerStep, 1)}) | ${f(r.tokensPerSecond, 1)} | ${mb(r.cacheBytes)} |`;
    }),
    '',
    `Decode tokens/s ratios (and of CPU time per step), same run: ours against transformers on ${hybridName ?? '-'}, and ${hybridName ?? '-'} against ${denseName ?? '-'} (ours both):`,
    '',
    '| prompt | batch | ours / transformers | hybrid / dense |',
    '| ---: | ---: | ---: | ---: |',
    ...base.prompts.flatMap((P) =>
      base.batches.map((B) => {
        const h = hybridName && find(hybridName, 'ours', P, B);
        const vsPeer = hybridName ? ratio(h || undefined, find(hybridName, 'transformers', P, B)) : '-';
        const vsDense = hybridName && denseName ? ratio(h || undefined, find(denseName, 'ours', P, B)) : '-';
        return `| ${P} | ${B} | ${vsPeer} | ${vsDense} |`;
      }),
    ),
    '',
    `Memory per sequence, and sequences of distinct prompts that fit in ${(budget / GIB).toFixed(0)} GiB of cache (ours: state slot + whole ${BLOCK}-position blocks; transformers: its cache's tensors):`,
    '',
    `| model | engine | state per sequence | K/V per position | ${base.prompts.map((P) => `bytes per sequence at ${P} | fit at ${P}`).join(' | ')} |`,
    `| --- | --- | ---: | ---: | ${base.prompts.map(() => '---: | ---:').join(' | ')} |`,
    ...memory.map(
      (m) =>
        `| ${m.model} | ${m.engine} | ${(m.stateBytes / 1e6).toFixed(2)} MB | ${(m.kvBytesPerToken / 1e3).toFixed(1)} KB | ${base.prompts
          .map((P) => `${mb(m.perSequence(P))} MB | ${Math.floor(budget / m.perSequence(P))}`)
          .join(' | ')} |`,
    ),
    '',
  ];
  process.stdout.write(out.join('\n'));
}

main().catch((e) => {
  process.stderr.write(`${(e as Error).stack}\n`);
  process.exit(1);
});
