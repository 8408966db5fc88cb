/**
 * Our training step alone on a benchmark shape (no PyTorch beside it: bench/compare.ts has that),
 * with or without the fused kernels: tokens/s, the step's parts and its model FLOPs utilisation
 * (MFU, against PRIME_BENCH_PEAK_TFLOPS, default 989: H100 / H200 SXM dense bf16). One markdown
 * row on stdout, so runs with and without the kernels, or of two shapes, make one table
 * (bench/gpu/plan.ts runs it so). bf16 is mixed precision (fp32 master weights).
 *
 *   node dist/bench/gpu/train-step.js [--model qwen3-0.6b|qwen3-1.7b|tiny] [--device cuda] [--dtype bfloat16]
 *     [--rows 2] [--row-len 4096] [--samples 4] [--loss-from 32] [--steps 3] [--fused-kernels] [--threads N]
 *     [--header]
 */
import * as os from 'node:os';
import { setThreads, type ComputeDType } from '../../native';
import { loadModel } from '../../lib/model/engine';
import { loadHfModel } from '../../lib/model/hf';
import { benchModel, QWEN3_0_6B, QWEN3_1_7B, TINY, type BenchShape } from '../shapes';
import { PEAK_TFLOPS, timeTraining, trainMfu } from '../train-bench';

const MODELS: Record<string, BenchShape> = { tiny: TINY, 'qwen3-0.6b': QWEN3_0_6B, 'qwen3-1.7b': QWEN3_1_7B };

function arg(name: string, dflt: string): string {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? process.argv[i + 1]! : dflt;
}
function intArg(name: string, dflt: number, min: number): number {
  const v = Number(arg(name, String(dflt)));
  if (!Number.isInteger(v) || v < min) {
    console.error(`train-step: --${name} must be an integer >= ${min}, not '${arg(name, '')}'`);
    process.exit(2);
  }
  return v;
}

async function main(): Promise<void> {
  const name = arg('model', 'qwen3-0.6b');
  if (!MODELS[name]) {
    console.error(`train-step: --model must be one of ${Object.keys(MODELS).join(', ')}, not '${name}'`);
    process.exit(2);
  }
  const device = arg('device', 'cuda');
  const dtype = arg('dtype', 'bfloat16') as ComputeDType;
  if (dtype !== 'bfloat16' && dtype !== 'float32') {
    console.error(`train-step: --dtype must be bfloat16 or float32, not '${dtype}'`);
    process.exit(2);
  }
  const [rows, rowLen, samples, steps] = [
    intArg('rows', 2, 1),
    intArg('row-len', 4096, 2),
    intArg('samples', 4, 1),
    intArg('steps', 3, 1),
  ];
  const lossFrom = intArg('loss-from', 32, 0);
  if (rowLen % samples !== 0 || lossFrom >= rowLen / samples) {
    console.error(`train-step: --row-len must split into --samples samples, each longer than --loss-from`);
    process.exit(2);
  }
  const fusedKernels = process.argv.includes('--fused-kernels');
  setThreads(intArg('threads', os.cpus().length, 1));
  const created = benchModel(name, MODELS[name]);
  const base = loadHfModel(created.dir);
  // bf16 training is mixed precision: fp32 master weights, the forward in bf16.
  const model = await loadModel(base.config, base.tensors, { device, dtype: 'float32', fusedKernels });
  const t = await timeTraining(model, {
    vocab: base.config.vocabSize,
    rows,
    rowLen,
    samples,
    lossFrom,
    steps,
    mixed: dtype === 'bfloat16',
  });
  const tps = t.tokens / t.seconds;
  const ms = (s: number | undefined) => (s === undefined ? '-' : (s * 1e3).toFixed(1));
  if (process.argv.includes('--header'))
    process.stdout.write(
      `Training step, ${device}, ${dtype}${dtype === 'bfloat16' ? ' mixed precision' : ''}, ${rows} packed rows of ${rowLen} tokens (${samples} samples each), ${steps} timed steps; MFU against ${PEAK_TFLOPS} TFLOP/s\n\n` +
        '| model | fused kernels | tokens/s | ms a step | last step: forward + backward ms | optimizer ms | MFU |\n' +
        '| --- | --- | ---: | ---: | ---: | ---: | ---: |\n',
    );
  process.stdout.write(
    `| ${name} (${(created.parameters / 1e6).toFixed(created.parameters < 1e8 ? 1 : 0)}M) | ${fusedKernels ? 'on' : 'off'} | ${tps.toFixed(0)} | ${ms(t.seconds / steps)} | ${ms(t.last?.forwardBackwardSeconds)} | ${ms(t.last?.optimizerSeconds)} | ${trainMfu(base.config, tps).toFixed(1)}% |\n`,
  );
}

main().catch((e: unknown) => {
  console.error(e);
  process.exit(1);
});
