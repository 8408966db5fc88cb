/**
 * Each fused kernel against the libtorch path it replaces, forward + backward, on the shapes of a
 * Qwen3-0.6B training step (2 packed rows of 4,096 tokens), bf16 mixed precision, in one process on
 * one card: milliseconds per call for both, and what the kernel saves over a training step (its
 * calls per row times the rows). The LM head row is the whole chunked head (GEMMs included), with
 * its softmax rows fused or as tensor ops.
 *
 *   node dist/bench/gpu/kernels.js [--device cuda] [--iters 20] [--out FILE]
 */
import * as fs from 'node:fs';
import { kernelTime, type KernelCheckOptions } from '../../native/checks';

const TOKENS = 4096,
  ROWS_PER_STEP = 2,
  LAYERS = 28;

function arg(name: string, dflt: string): string {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? process.argv[i + 1]! : dflt;
}

/** The 0.6B step's shapes and how often a row of the step calls each. */
const CASES: Array<{ label: string; calls: number; options: Omit<KernelCheckOptions, 'dtype' | 'device'> }> = [
  // The input norms and the final norm (the post-attention norms are fused with the residual add).
  { label: 'RMSNorm, hidden 1,024', calls: LAYERS + 1, options: { kernel: 'rmsNorm', rows: TOKENS, width: 1024 } },
  {
    label: 'RMSNorm, q (16 heads of 128)',
    calls: LAYERS,
    options: { kernel: 'rmsNorm', rows: TOKENS, heads: 16, width: 128 },
  },
  {
    label: 'RMSNorm, k (8 heads of 128)',
    calls: LAYERS,
    options: { kernel: 'rmsNorm', rows: TOKENS, heads: 8, width: 128 },
  },
  {
    label: 'residual add + RMSNorm, 1,024',
    calls: LAYERS,
    options: { kernel: 'addRmsNorm', rows: TOKENS, width: 1024 },
  },
  {
    label: 'RoPE, q and k (16 + 8 heads of 128)',
    calls: LAYERS,
    options: { kernel: 'rope', rows: TOKENS, heads: 16, kvHeads: 8, width: 128 },
  },
  { label: 'SwiGLU, 3,072', calls: LAYERS, options: { kernel: 'swiglu', rows: TOKENS, width: 3072 } },
  {
    label: 'LM head, vocabulary 151,936 (with GEMMs)',
    calls: 1,
    options: { kernel: 'lmHead', rows: TOKENS, width: 1024, vocab: 151936, entropyGrad: false },
  },
];

async function main() {
  const device = arg('device', 'cuda');
  const iters = Number(arg('iters', '20'));
  const lines = [
    `Fused kernels against libtorch on ${device}, bf16 mixed precision, forward + backward, ${iters} passes each`,
    '',
    '| kernel | libtorch ms | fused ms | speed-up | saved per step (2 x 4,096 tokens), ms |',
    '| --- | ---: | ---: | ---: | ---: |',
  ];
  let saved = 0;
  for (const c of CASES) {
    const t = await kernelTime({ ...c.options, dtype: 'bfloat16', device, iters, seed: 1 });
    const perStep = (t.unfused - t.fused) * 1e3 * c.calls * ROWS_PER_STEP;
    saved += perStep;
    lines.push(
      `| ${c.label} | ${(t.unfused * 1e3).toFixed(3)} | ${(t.fused * 1e3).toFixed(3)} | ${(t.unfused / t.fused).toFixed(2)}x | ${perStep.toFixed(1)} |`,
    );
    console.log(lines[lines.length - 1]);
  }
  lines.push(`| all | | | | ${saved.toFixed(1)} |`);
  const table = lines.join('\n');
  console.log('\n' + table);
  const out = process.argv.includes('--out') ? arg('out', '') : '';
  if (out) fs.writeFileSync(out, table + '\n');
}

main().catch((e: unknown) => {
  console.error(e);
  process.exit(1);
});
