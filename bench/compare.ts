/**
 * Our engine against Hugging Face transformers + PyTorch eager, on the same model folder, same
 * threads and shapes, back to back: decode at batch 1/16/64 (64-token prompts, 64 sampled tokens,
 * prefill included) and training on packed rows (fwd + bwd + clip + AdamW), for a Qwen3-vocabulary
 * model and a byte-vocabulary one (`model create --preset small`). Prints a markdown table with
 * the ratios. Each workload runs in its own process, so its peak RSS is its own.
 *
 *   npm run bench:compare [-- --models qwen3,bytes --threads 2 --batches 1,16,64 --rows 2 --row-len 512 --skip-torch]
 *
 * On a GPU (issue #16: Qwen3-0.6B's shape, bf16, the card's own Python for the PyTorch side):
 *   node dist/bench/compare.js --models qwen3-0.6b --device cuda --dtype bfloat16 --python python3 \
 *     --prompt 128 --new 256 --batches 1,64,256 --rows 2 --row-len 4096 --samples 4 --eager-batches 1,64
 * (decode replays CUDA graphs captured in its warm-up; --eager-batches adds rows with graphs off;
 * --no-train leaves the training workload out, --batches none the decode ones; --profile <dir>
 * profiles one more training step on each side: <dir>/ours-train.txt next to torch-train.txt;
 * --engine-options '<json>' adds loadModel options on our side, e.g. '{"logitsChunkTokens":2048}';
 * --loss-from K: CE on tokens K.. of each training sample, default 32, 0 for every token).
 * bf16 training is mixed precision on both sides, fp32 master weights: ours keeps every activation
 * in bf16 (bf16 compute weights, as FSDP2's param_dtype); PyTorch runs twice, under autocast (fp32
 * activations between the matmuls) and in our scheme. The MFU column divides by
 * PRIME_BENCH_PEAK_TFLOPS (default 989, H100 / H200 SXM dense bf16).
 *
 * The PyTorch side runs in a venv this script creates in build/bench-venv from PyPI (torch and
 * transformers with their dependencies, as a user installs them). On the CPU, decode is also
 * measured against llama.cpp, what a CPU user runs for generation: its source ships in PyPI's
 * llama-cpp-python sdist (vendor/llama.cpp), which this script downloads into build/bench-llama and
 * builds (`llama-batched-bench`, CPU backend, the machine's own instruction sets), converting the
 * model with llama.cpp's `convert_hf_to_gguf.py` (F32, or BF16 with --dtype bfloat16).
 * `llama-batched-bench -npp <prompt> -ntg <new> -npl <batch>` decodes the same workload, prefill
 * included, and computes every row's logits each step (it does not sample). --no-llama leaves it
 * out. Nothing is downloaded by the test suite. The output names each peer's version.
 * --rounds R: each workload R times, ours and the peers alternating, medians reported (and the
 * median of the per-round ratios), for a machine whose speed drifts.
 * --gemm: first a table of the model's projections as GEMMs (x [m, k] times w [n, k] transposed, at
 * the decode batches and the training row's tokens): ours as an inference forward runs them
 * (linearGflops) against torch.nn.functional.linear, same threads and dtype. With
 * --baseline-addon <prime_native.node> the engine side also runs on another build of the addon
 * (e.g. main's), for before/after figures in the same run. --train-steps: timed steps (default 3). FLOPs: 2 x (matmul parameters) per decoded token, 6 x per trained token (the tied
 * embedding counts once, as the LM head), attention left out; the yardstick is a 2048^3 fp32
 * matmul of the engine, measured before and after.
 */
import { execFileSync, spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import type { ArchConfig } from '../lib/model/arch';
import { createModel, type CreateModelOptions } from '../lib/model/create';
import { loadHfModel } from '../lib/model/hf';
import { randomTokens } from '../lib/model/testing';
import { Rng } from '../lib/model/rng';
import { parameterCount } from '../lib/model/tensors';
import { info, setThreads, type ComputeDType, type ModelOptions } from '../native';
import { linearGflops, matmulGflops } from '../native/checks';
import { loadModel } from '../lib/model/engine';
import { benchModel, QWEN3_0_6B, QWEN3_5_0_8B, TINY_QWEN3_5 } from './shapes';
import { matmulParameters, PEAK_TFLOPS, timeTraining } from './train-bench';

const ROOT = path.resolve(__dirname, '..', '..');
const VENV = path.join(ROOT, 'build', 'bench-venv');
const PY = path.join(VENV, 'bin', 'python');
// PyPI's Linux torch wheel is the CUDA build: `import torch` loads its CUDA libraries (cuDNN, cuBLAS, ...)
// even on a CPU machine, so they come too (about 5 GB in all); only PyPI is used.
const PINS = ['torch==2.15.0', 'transformers==5.24.0'];
// llama.cpp: the source in this sdist (vendor/llama.cpp), and what its converter needs beyond the venv.
const LLAMA_CPP_PYTHON = 'llama-cpp-python==0.3.36';
const LLAMA_DIR = path.join(ROOT, 'build', 'bench-llama');
// Prompt and new tokens per decoded sequence, samples per packed training row (--prompt, --new,
// --samples; the Python side reads them from the environment this script sets).
const PROMPT = Number(process.env.PRIME_BENCH_PROMPT ?? 64),
  NEW = Number(process.env.PRIME_BENCH_NEW ?? 64),
  SAMPLES = Number(process.env.PRIME_BENCH_SAMPLES ?? 4);
// --loss-from K: training's CE is on tokens K.. of each sample (default 32; 0 = every token), both
// sides. The tokens before K stand for a prompt: our trainer runs the LM head on loss tokens only.
const LOSS_FROM = Number(process.env.PRIME_BENCH_LOSS_FROM ?? 32);
const WARMUP_TOKENS = 16; // a decode warm-up's new tokens, both sides
// --rounds: each workload this many times, the sides alternating (medians reported).
const ROUNDS = Math.max(1, Number(arg('rounds', '1')));
// --profile <dir>: after the timed training steps, one more step on each side under its profiler
// (ours: native/src/profile.h; PyTorch's: torch.profiler), summaries and traces into <dir>.
const PROFILE = process.env.PRIME_BENCH_PROFILE;
// --engine-options: more loadModel options for our side (a sweep of the LM head's chunking, say).
const ENGINE_OPTIONS = JSON.parse(process.env.PRIME_BENCH_ENGINE_OPTIONS ?? '{}') as ModelOptions;
const DEVICE = process.env.PRIME_BENCH_DEVICE ?? 'cpu',
  DTYPE = (process.env.PRIME_BENCH_DTYPE ?? 'float32') as ComputeDType;
// The models: the CPU ones by tokenizer (`model create --preset small`), and the GPU one.
const MODELS: Record<string, Omit<CreateModelOptions, 'out' | 'seed'>> = {
  qwen3: { arch: 'qwen3', preset: 'small', tokenizer: 'qwen3' },
  bytes: { arch: 'qwen3', preset: 'small', tokenizer: 'bytes' },
  'qwen3-0.6b': QWEN3_0_6B,
  // Issue #46, and a tiny Qwen3.5 that checks the workloads run on it in seconds.
  'qwen3_5-0.8b': QWEN3_5_0_8B,
  'qwen3_5-tiny': TINY_QWEN3_5,
};

/** A benchmark model's folder in build/bench-models, created on first use. */
function modelFolder(kind: string): { dir: string; config: ArchConfig } {
  // The models of a real shape are shared with the other benchmarks (one folder per shape).
  if (kind !== 'qwen3' && kind !== 'bytes') return benchModel(kind, MODELS[kind]);
  const dir = path.join(ROOT, 'build', 'bench-models', `small-${kind}`);
  const config = fs.existsSync(path.join(dir, 'config.json'))
    ? loadHfModel(dir).config
    : createModel({ ...MODELS[kind], seed: 1, out: dir }).config;
  return { dir, config };
}

/** The GEMMs of a model's forward at `rows` tokens: [label, m, k, n]. */
function projectionShapes(c: ArchConfig, rows: number): [string, number, number, number][] {
  const D = c.hiddenSize,
    qkv = (c.numHeads + 2 * c.numKvHeads) * c.headDim;
  return [
    [`q/k/v, ${rows} rows`, rows, D, qkv],
    [`o, ${rows} rows`, rows, c.numHeads * c.headDim, D],
    [`gate/up, ${rows} rows`, rows, D, 2 * c.intermediateSize],
    [`down, ${rows} rows`, rows, c.intermediateSize, D],
    [`LM head, ${rows} rows`, rows, D, c.vocabSize],
  ];
}

interface Result {
  tokensPerSecond: number;
  seconds: number;
  peakRssMb: number;
  /** The peer's versions (compare_torch.py: torch and transformers). */
  versions?: Record<string, string>;
  /** compare_torch.py gemm: GFLOP/s per shape. */
  gflops?: number[];
}

function arg(name: string, dflt: string): string {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? process.argv[i + 1] : dflt;
}

function ensureVenv(): void {
  const stamp = path.join(VENV, '.pins'),
    pins = PINS.join(' ');
  if (fs.existsSync(stamp) && fs.readFileSync(stamp, 'utf8') === pins) return;
  console.error(`[bench] creating ${VENV} (${pins} from PyPI, about 5 GB)`);
  fs.rmSync(VENV, { recursive: true, force: true });
  execFileSync('python3', ['-m', 'venv', VENV], { stdio: 'inherit' });
  const pip = [path.join(VENV, 'bin', 'pip'), 'install', '--quiet', '--disable-pip-version-check'];
  execFileSync(pip[0], [...pip.slice(1), ...PINS], { stdio: 'inherit' });
  fs.writeFileSync(stamp, pins);
}

/**
 * llama.cpp from the llama-cpp-python sdist, built once into build/bench-llama (a few minutes):
 * `llama-batched-bench` and the converter's Python package (gguf, into the bench venv).
 */
function ensureLlamaCpp(): { bench: string; source: string } {
  const stamp = path.join(LLAMA_DIR, '.pins'),
    version = LLAMA_CPP_PYTHON.split('==')[1];
  const source = path.join(LLAMA_DIR, `llama_cpp_python-${version}`, 'vendor', 'llama.cpp');
  const bench = path.join(source, 'build', 'bin', 'llama-batched-bench');
  if (fs.existsSync(stamp) && fs.readFileSync(stamp, 'utf8') === LLAMA_CPP_PYTHON && fs.existsSync(bench))
    return { bench, source };
  console.error(`[bench] building llama.cpp from the ${LLAMA_CPP_PYTHON} sdist (PyPI) in ${LLAMA_DIR}`);
  fs.rmSync(LLAMA_DIR, { recursive: true, force: true });
  fs.mkdirSync(LLAMA_DIR, { recursive: true });
  const pip = path.join(VENV, 'bin', 'pip');
  const quiet = ['--quiet', '--disable-pip-version-check'];
  execFileSync(pip, ['download', ...quiet, '--no-deps', '--no-binary', ':all:', LLAMA_CPP_PYTHON, '-d', LLAMA_DIR], {
    stdio: 'inherit',
  });
  execFileSync('tar', ['xzf', path.join(LLAMA_DIR, `llama_cpp_python-${version}.tar.gz`), '-C', LLAMA_DIR]);
  const off = ['-DLLAMA_CURL=OFF', '-DLLAMA_OPENSSL=OFF', '-DLLAMA_BUILD_TESTS=OFF', '-DLLAMA_BUILD_SERVER=OFF'];
  execFileSync('cmake', ['-S', source, '-B', path.join(source, 'build'), '-DCMAKE_BUILD_TYPE=Release', ...off], {
    stdio: ['ignore', 'ignore', 'inherit'],
  });
  execFileSync('cmake', ['--build', path.join(source, 'build'), '--target', 'llama-batched-bench', '-j', '2'], {
    stdio: ['ignore', 'ignore', 'inherit'],
  });
  // The converter's Python side: its gguf package, and sentencepiece, which it imports while it
  // looks for a SentencePiece vocabulary before it reads tokenizer.json (Qwen3's).
  execFileSync(pip, ['install', ...quiet, path.join(source, 'gguf-py'), 'sentencepiece==0.2.3'], { stdio: 'inherit' });
  fs.writeFileSync(stamp, LLAMA_CPP_PYTHON);
  return { bench, source };
}

/** The model folder as a GGUF file of llama.cpp's converter (F32 or BF16), made once. */
function ggufOf(source: string, dir: string, dtype: ComputeDType): string {
  const type = dtype === 'bfloat16' ? 'bf16' : 'f32';
  const out = path.join(LLAMA_DIR, 'models', `${path.basename(dir)}-${type}.gguf`);
  if (fs.existsSync(out)) return out;
  fs.mkdirSync(path.dirname(out), { recursive: true });
  const args = [path.join(source, 'convert_hf_to_gguf.py'), dir, '--outtype', type, '--outfile', `${out}.tmp`];
  execFileSync(PY, args, { stdio: ['ignore', 'ignore', 'inherit'] });
  fs.renameSync(`${out}.tmp`, out);
  return out;
}

/**
 * llama.cpp's decode of the workload: `batch` sequences of PROMPT random tokens, NEW more each,
 * prefill included (its T = T_PP + T_TG), `threads` threads for both phases.
 */
function llamaDecode(benchBin: string, gguf: string, batch: number, threads: number): Result {
  const args = ['-m', gguf, '-c', String(batch * (PROMPT + NEW)), '-npp', String(PROMPT), '-ntg', String(NEW)];
  args.push('-npl', String(batch), '-t', String(threads), '-tb', String(threads), '--output-format', 'jsonl');
  const run = spawnSync(benchBin, args, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'pipe'] });
  const out = `${run.stdout}\n${run.stderr}`;
  const line = out.split('\n').find((l) => l.startsWith('{"n_kv_max"'));
  if (run.status !== 0 || !line) throw new Error(`llama-batched-bench failed (${run.status}): ${out.slice(-800)}`);
  const r = JSON.parse(line) as { t: number };
  // "version: 0.5.0-dev (build 1, commit 0c1e570)"
  const version = spawnSync(benchBin, ['--version'], { encoding: 'utf8' });
  const build = /version: (.*)/.exec(`${version.stdout}${version.stderr}`)?.[1] ?? 'unknown version';
  return {
    tokensPerSecond: (batch * NEW) / r.t,
    seconds: r.t,
    peakRssMb: NaN,
    versions: { 'llama.cpp': `${build}, from ${LLAMA_CPP_PYTHON}'s sdist` },
  };
}

/** Engine side of one workload, in this (child) process. */
async function engineWorkload(dir: string, what: string, args: number[], threads: number): Promise<Result> {
  setThreads(threads);
  const base = loadHfModel(dir);
  // Training in bf16 is mixed precision (fp32 master weights), as the PyTorch side's autocast.
  const train = what === 'train';
  const dtype: ComputeDType = train && DTYPE === 'bfloat16' ? 'float32' : DTYPE;
  const model = await loadModel(base.config, base.tensors, { ...ENGINE_OPTIONS, device: DEVICE, dtype });
  const V = base.config.vocabSize;
  const rng = new Rng(0);
  let tokens = 0,
    seconds = 0;
  if (what === 'decode') {
    const [batch, eager] = args;
    // One generator for the warm-up and the timed run, as a server keeps one: on CUDA the warm-up
    // runs the whole workload, so the timed run replays CUDA graphs captured before it (as vLLM
    // captures at start-up); elsewhere a short run at batch 1, as the Python side's warm-up.
    const gen = model.createGenerator({ maxSequences: batch, maxSequenceLength: PROMPT + NEW + 1, cudaGraphs: !eager });
    const run = async (b: number, maxTokens = NEW) => {
      const t0 = process.hrtime.bigint();
      await gen.add(
        Array.from({ length: b }, (_, i) => ({ promptIds: randomTokens(rng, PROMPT, V), maxTokens, seed: i })),
      );
      let live = b;
      while (live > 0) live -= (await gen.step()).filter((t) => t.finished).length;
      return Number(process.hrtime.bigint() - t0) / 1e9;
    };
    if (DEVICE.startsWith('cuda') && !eager) await run(batch);
    else await run(1, Math.min(NEW, WARMUP_TOKENS));
    seconds = await run(batch);
    tokens = batch * NEW;
    const { cudaGraphs, eagerReason, times } = gen.stats();
    // The generator's step times since it was created (the warm-up included), where a run's time went.
    const t = (['forward', 'attention', 'sample'] as const).map((k) => `${k} ${times[k].toFixed(2)} s`).join(', ');
    console.error(
      `[bench] decode batch ${batch}: ${cudaGraphs > 0 ? `${cudaGraphs} CUDA graphs` : `eager (${eagerReason})`}; ${t}`,
    );
  } else {
    const [rows, len] = args;
    const steps = Number(process.env.PRIME_BENCH_TRAIN_STEPS ?? 3);
    const t = await timeTraining(model, {
      vocab: V,
      rows,
      rowLen: len,
      samples: SAMPLES,
      lossFrom: LOSS_FROM,
      steps,
      mixed: DTYPE === 'bfloat16',
      // --profile: one more step under the profiler (not timed).
      profile: PROFILE ? path.join(PROFILE, 'ours-train') : undefined,
    });
    ({ tokens, seconds } = t);
    if (t.last)
      console.error(
        `[bench] train step: forward + backward ${(t.last.forwardBackwardSeconds * 1e3).toFixed(1)} ms, optimizer ${(t.last.optimizerSeconds * 1e3).toFixed(1)} ms, step ${(t.last.seconds * 1e3).toFixed(1)} ms`,
      );
  }
  return { tokensPerSecond: tokens / seconds, seconds, peakRssMb: process.resourceUsage().maxRSS / 1024 };
}

function child(cmd: string, args: string[], env: NodeJS.ProcessEnv = process.env): Result {
  const out = execFileSync(cmd, args, { encoding: 'utf8', stdio: ['ignore', 'pipe', 'inherit'], env });
  return JSON.parse(out.trim().split('\n').pop()!) as Result;
}

async function main(): Promise<void> {
  if (process.argv[2] === '--engine') {
    const [dir, what, ...rest] = process.argv.slice(3);
    const nums = rest.map(Number);
    console.log(JSON.stringify(await engineWorkload(dir, what, nums.slice(0, -1), nums[nums.length - 1])));
    return;
  }
  const threads = Number(arg('threads', '2'));
  const kinds = arg('models', 'qwen3,bytes').split(',');
  for (const k of kinds)
    if (!MODELS[k]) throw new Error(`--models: unknown '${k}' (known: ${Object.keys(MODELS).join(', ')})`);
  process.env.PRIME_BENCH_DEVICE = arg('device', 'cpu');
  process.env.PRIME_BENCH_DTYPE = arg('dtype', 'float32');
  process.env.PRIME_BENCH_PROMPT = arg('prompt', '64');
  process.env.PRIME_BENCH_NEW = arg('new', '64');
  process.env.PRIME_BENCH_SAMPLES = arg('samples', '4');
  process.env.PRIME_BENCH_LOSS_FROM = arg('loss-from', '32');
  if (process.argv.includes('--profile')) {
    process.env.PRIME_BENCH_PROFILE = path.resolve(arg('profile', ''));
    fs.mkdirSync(process.env.PRIME_BENCH_PROFILE, { recursive: true });
  }
  const gpu = process.env.PRIME_BENCH_DEVICE !== 'cpu';
  // --python: a Python that has torch and transformers (the GPU machine's); else the bench venv.
  const py = process.argv.includes('--python') ? arg('python', 'python3') : PY;
  // --batches none: no decode workloads (training alone).
  const batches = arg('batches', '1,16,64') === 'none' ? [] : arg('batches', '1,16,64').split(',').map(Number);
  const eagerBatches = process.argv.includes('--eager-batches') ? arg('eager-batches', '').split(',').map(Number) : [];
  const rows = Number(arg('rows', '2')),
    rowLen = Number(arg('row-len', '512'));
  // --loss-from: a token index inside a sample (row length / samples), or nothing would be trained.
  const lossFrom = Number(process.env.PRIME_BENCH_LOSS_FROM),
    sampleLen = rowLen / Number(process.env.PRIME_BENCH_SAMPLES);
  if (!Number.isInteger(lossFrom) || lossFrom < 0 || lossFrom >= sampleLen) {
    console.error(
      `--loss-from: '${process.env.PRIME_BENCH_LOSS_FROM}' is not a token index in [0, ${sampleLen}) (a sample is --row-len / --samples tokens)`,
    );
    process.exit(2);
  }
  const torch = !process.argv.includes('--skip-torch');
  const baseline = process.argv.includes('--baseline-addon') ? path.resolve(arg('baseline-addon', '')) : null;
  process.env.PRIME_BENCH_TRAIN_STEPS = arg('train-steps', '3');
  if (process.argv.includes('--engine-options')) {
    const text = arg('engine-options', '');
    try {
      const o: unknown = JSON.parse(text);
      if (typeof o !== 'object' || o === null || Array.isArray(o)) throw new Error('not an object');
    } catch (e) {
      console.error(`--engine-options: '${text}' is not a JSON object of loadModel options (${(e as Error).message})`);
      process.exit(2);
    }
    process.env.PRIME_BENCH_ENGINE_OPTIONS = text;
  }
  if (torch && py === PY) ensureVenv();
  // llama.cpp: CPU decode only (its bench builds for this machine's CPU); needs the bench venv for
  // its converter.
  const withLlama = !gpu && batches.length > 0 && !process.argv.includes('--no-llama');
  if (withLlama && !fs.existsSync(PY)) ensureVenv();
  const llamaBuild = withLlama ? ensureLlamaCpp() : null;
  const versions: Record<string, string> = {};
  setThreads(threads);
  const peak0 = gpu ? 0 : await matmulGflops(2048, 10);
  const lines: string[] = [];
  if (process.argv.includes('--gemm')) await gemmTable(kinds, batches, rows * rowLen, threads, py, torch);
  for (const kind of kinds) {
    const { dir, config: c } = modelFolder(kind);
    const llama = llamaBuild
      ? { bench: llamaBuild.bench, gguf: ggufOf(llamaBuild.source, dir, process.env.PRIME_BENCH_DTYPE as ComputeDType) }
      : null;
    const total = parameterCount(c);
    const P = matmulParameters(c);
    const name = `${kind === 'qwen3' || kind === 'bytes' ? `small ${kind}` : kind} (V ${c.vocabSize}, ${(total / 1e6).toFixed(1)}M)`;
    // [label, engine / compare_torch.py args, FLOPs per token, PyTorch's mixed-precision scheme]
    type Workload = [string, string[], number, 'autocast' | 'master'];
    const decodes = batches.map((b): Workload => [`decode batch ${b}`, ['decode', String(b), '0'], 2 * P, 'autocast']);
    // --eager-batches: the same decode with CUDA graphs off (the engine side alone; its ratio is to
    // the transformers figure of the same batch).
    for (const b of eagerBatches)
      decodes.push([`decode batch ${b}, eager`, ['decode', String(b), '1'], 2 * P, 'autocast']);
    const train: Workload = [`train ${rows} x ${rowLen}`, ['train', String(rows), String(rowLen)], 6 * P, 'autocast'];
    // bf16 training: PyTorch both ways (compare_torch.py's PRIME_BENCH_TORCH_MIXED), autocast and
    // the engine's own scheme (bf16 weights over fp32 masters), beside one run of ours.
    const bothSchemes = process.env.PRIME_BENCH_DTYPE === 'bfloat16' && torch;
    const trains: Workload[] = process.argv.includes('--no-train')
      ? []
      : bothSchemes
        ? [train, [`${train[0]}, torch bf16 over fp32 masters`, train[1], train[2], 'master']]
        : [train];
    // On a GPU training first: its MFU is the figure a time-boxed run must not lose.
    const workloads = gpu ? [...trains, ...decodes] : [...decodes, ...trains];
    const theirsByLabel = new Map<string, Result>();
    // Our side once per workload args: the second training row reuses the first's.
    const oursByArgs = new Map<string, { ours: Result; before: Result | null }>();
    for (const [label, w, flopsPerToken, torchMixed] of workloads) {
      const engineArgs = [__filename, '--engine', dir, ...w, String(threads)];
      const eagerRow = w[0] === 'decode' && w[2] === '1';
      const runTorch = () =>
        child(
          py,
          [
            path.join(ROOT, 'bench', 'compare_torch.py'),
            dir,
            ...w.slice(0, w[0] === 'decode' ? 2 : 3),
            String(threads),
          ],
          {
            ...process.env,
            PRIME_BENCH_TORCH_MIXED: torchMixed,
            // With both schemes, PyTorch's profile is of its run in ours (the second).
            ...(w[0] === 'train' && torchMixed === 'autocast' && bothSchemes ? { PRIME_BENCH_PROFILE: '' } : {}),
          },
        );
      const llamaRow = llama !== null && w[0] === 'decode' && !eagerRow;
      // Each round: the baseline build, ours, PyTorch, llama.cpp, back to back.
      const rounds: { ours: Result; before: Result | null; theirs: Result | null; llama: Result | null }[] = [];
      for (let r = 0; r < ROUNDS; r++) {
        let measured = r === 0 ? oursByArgs.get(w.join(' ')) : undefined;
        if (!measured) {
          const before = baseline
            ? child(process.execPath, engineArgs, { ...process.env, PRIME_NATIVE_ADDON: baseline })
            : null;
          measured = { ours: child(process.execPath, engineArgs), before };
          if (r === 0) oursByArgs.set(w.join(' '), measured);
        }
        const theirs = !torch ? null : eagerRow ? (theirsByLabel.get(`decode batch ${w[1]}`) ?? null) : runTorch();
        const ll = llamaRow ? llamaDecode(llama.bench, llama.gguf, Number(w[1]), threads) : null;
        rounds.push({ ...measured, theirs, llama: ll });
        for (const x of [theirs, ll]) if (x?.versions) Object.assign(versions, x.versions);
      }
      const med = (xs: (Result | null)[]): Result | null => {
        const ok = xs.filter((x): x is Result => x !== null).sort((a, b) => a.tokensPerSecond - b.tokensPerSecond);
        return ok.length ? ok[Math.floor((ok.length - 1) / 2)] : null;
      };
      // The median of the rounds' ratios (each round's two figures were measured minutes apart).
      const ratio = (other: (r: (typeof rounds)[number]) => Result | null) => {
        const xs = rounds
          .map((r) => (other(r) ? r.ours.tokensPerSecond / other(r)!.tokensPerSecond : NaN))
          .filter((x) => !Number.isNaN(x))
          .sort((a, b) => a - b);
        return xs.length ? `${xs[Math.floor((xs.length - 1) / 2)].toFixed(2)}x` : '-';
      };
      const ours = med(rounds.map((r) => r.ours))!,
        before = med(rounds.map((r) => r.before)),
        theirs = med(rounds.map((r) => r.theirs)),
        ll = med(rounds.map((r) => r.llama));
      if (theirs) theirsByLabel.set(label, theirs);
      const gf = (r: Result) => (r.tokensPerSecond * flopsPerToken) / 1e9;
      // On a GPU: model FLOPs utilisation against the card's dense bf16 peak, both sides.
      const mfu = (r: Result | null) => (r ? `${((100 * gf(r)) / (PEAK_TFLOPS * 1e3)).toFixed(1)}%` : '-');
      const util = gpu ? `${mfu(ours)} / ${mfu(theirs)}` : gf(ours).toFixed(1);
      const tps = (r: Result | null) => (r ? r.tokensPerSecond.toFixed(1) : '-');
      const all = (f: (r: (typeof rounds)[number]) => Result | null) =>
        ROUNDS > 1 && f(rounds[0]) ? ` (${rounds.map((r) => f(r)!.tokensPerSecond.toFixed(0)).join(', ')})` : '';
      lines.push(
        `| ${name} | ${label} | ${tps(ours)}${all((r) => r.ours)} | ${tps(theirs)}${all((r) => r.theirs)} | ` +
          `${ratio((r) => r.theirs)} | ${tps(ll)}${all((r) => r.llama)} | ${ratio((r) => r.llama)} | ${util} | ` +
          `${ours.peakRssMb.toFixed(0)} | ${theirs ? theirs.peakRssMb.toFixed(0) : '-'} | ` +
          `${before ? `${before.tokensPerSecond.toFixed(1)} / ${before.peakRssMb.toFixed(0)}` : '-'} |`,
      );
      console.error(lines[lines.length - 1]);
    }
  }
  const peak = gpu ? 0 : Math.max(peak0, await matmulGflops(2048, 10));
  const { blasCore, blas, cpuKernels, torchVersion } = info();
  console.log(
    gpu
      ? `${process.env.PRIME_BENCH_DEVICE}, ${process.env.PRIME_BENCH_DTYPE}; MFU against a dense bf16 peak of ${PEAK_TFLOPS} TFLOP/s; prompts ${process.env.PRIME_BENCH_PROMPT} + ${process.env.PRIME_BENCH_NEW} new tokens; ${process.env.PRIME_BENCH_SAMPLES} samples per training row\n`
      : `${threads} threads, ${process.env.PRIME_BENCH_DTYPE}; engine matmul 2048^3: ${peak.toFixed(1)} GFLOP/s; ours: libtorch ${torchVersion}, GEMMs by ${blas ?? 'libtorch'}${blasCore ? ` (OpenBLAS ${blasCore} kernels)` : ''}, own CPU loops for ${cpuKernels}`,
  );
  const peers = Object.entries(versions).map(([k, v]) => `${k} ${v}`);
  console.log(`peers: ${peers.length ? peers.join(', ') : 'none'}${ROUNDS > 1 ? `; ${ROUNDS} rounds, medians` : ''}\n`);
  console.log(
    `| model | workload | ours tok/s | torch tok/s | ratio | llama.cpp tok/s | ratio | ${gpu ? 'MFU ours / torch' : 'ours GFLOP/s'} | ours peak RSS MB | torch peak RSS MB | baseline tok/s / peak MB |`,
  );
  console.log('|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|');
  for (const l of lines) console.log(l);
  console.log(`\nGFLOP/s as a share of the matmul yardstick: divide by ${peak.toFixed(1)}.`);
}

/** --gemm: the models' projections as GEMMs, ours (an inference forward's) against PyTorch's linear. */
async function gemmTable(
  kinds: string[],
  batches: number[],
  trainRows: number,
  threads: number,
  py: string,
  torch: boolean,
) {
  const dtype = process.env.PRIME_BENCH_DTYPE as ComputeDType;
  const out: string[] = [];
  for (const kind of kinds) {
    const c = modelFolder(kind).config;
    const shapes = [...batches, trainRows].flatMap((m) => projectionShapes(c, m));
    const theirs = torch
      ? child(py, [
          path.join(ROOT, 'bench', 'compare_torch.py'),
          '-',
          'gemm',
          shapes.map((s) => s.slice(1).join(',')).join(';'),
          String(threads),
        ])
      : null;
    for (const [i, [label, m, k, n]] of shapes.entries()) {
      const iters = Math.max(3, Math.round(4e9 / (2 * m * k * n)));
      const ours = await linearGflops(m, k, n, iters, dtype);
      const t = theirs?.gflops?.[i];
      out.push(
        `| ${kind} | ${label} (k ${k}, n ${n}) | ${ours.toFixed(1)} | ${t ? t.toFixed(1) : '-'} | ${t ? (ours / t).toFixed(2) + 'x' : '-'} |`,
      );
      console.error(out[out.length - 1]);
    }
  }
  console.log(
    `GEMMs, ${dtype}, ${threads} threads (GFLOP/s)\n\n| model | product | ours | torch | ratio |\n|---|---|---:|---:|---:|`,
  );
  for (const l of out) console.log(l);
  console.log('');
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
