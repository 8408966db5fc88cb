/**
 * Data-parallel trainer throughput: the same global batch trained by one process (world size 1)
 * and by two ranks over Gloo (world size 2), each process on one core (one ATen thread,
 * OPENBLAS_NUM_THREADS=1). Prints tokens/s of the whole step and the share of the step spent in
 * the gradient all-reduce and ZeRO-1 parameter broadcast (waiting for the slower rank included).
 *   npm run build:ts && node dist/bench/dist.js [hidden_size] [layers]
 */
import { fork } from 'node:child_process';
import type { ArchConfig } from '../lib/model/arch';
import { packRow, randomTokens, randomWeights } from '../lib/model/testing';
import { Rng } from '../lib/model/rng';
import { freePort } from '../lib/net';
import { shardRows } from '../lib/trainer/runtime';
import * as native from '../native';

const ROWS = 8,
  SEQ = 512,
  STEPS = 4;

function config(hidden: number, layers: number): ArchConfig {
  return {
    arch: 'llama',
    vocabSize: 8192,
    hiddenSize: hidden,
    intermediateSize: 3 * hidden,
    numLayers: layers,
    numHeads: hidden / 64,
    numKvHeads: Math.max(1, hidden / 128),
    headDim: 64,
    rmsNormEps: 1e-6,
    ropeTheta: 10000,
    maxPositionEmbeddings: 4096,
    tieWordEmbeddings: false,
    attentionBias: false,
    qkNorm: false,
  };
}

/** The global batch: ROWS packed rows of SEQ tokens (4 samples each), the same on every rank. */
function batch(c: ArchConfig): native.TrainRow[] {
  const rng = new Rng(2);
  return Array.from({ length: ROWS }, () => {
    const samples = Array.from({ length: 4 }, () => randomTokens(rng, SEQ / 4, c.vocabSize));
    return { ...packRow(samples), lossMask: samples.flatMap((s) => s.map((_, i) => (i >= 32 ? 1 : 0))) };
  });
}

interface Result {
  seconds: number;
  comm: number;
  params: number;
}

/** Trains STEPS steps (after one warm-up) as `rank` of `size`; seconds per step and comm seconds. */
async function train(c: ArchConfig, rank: number, size: number, port: number): Promise<Result> {
  native.setThreads(1);
  const model = await native.loadModel(c, randomWeights(c, 1));
  const trainer = model.createTrainer();
  if (size > 1) {
    const store = await native.createStore({ host: '127.0.0.1', port, isServer: rank === 0, timeoutS: 60 });
    const group = await native.createGroup(store, { prefix: 'bench/', rank, size, timeoutS: 120 });
    trainer.setGroup(group, { bucketBytes: 25 * 1024 * 1024 });
  }
  const rows = shardRows(batch(c), rank, size);
  await trainer.step(rows, { lr: 1e-4, maxGradNorm: 1 });
  let seconds = 0,
    comm = 0;
  for (let i = 0; i < STEPS; i++) {
    const s = await trainer.step(rows, { lr: 1e-4, maxGradNorm: 1 });
    seconds += s.seconds;
    comm += s.commSeconds;
  }
  return { seconds: seconds / STEPS, comm: comm / STEPS, params: model.numParameters };
}

async function main(): Promise<void> {
  const [hidden, layers] = [Number(process.argv[2] ?? 256), Number(process.argv[3] ?? 4)];
  const c = config(hidden, layers);
  if (process.argv[4] === 'rank') {
    const [rank, size, port] = process.argv.slice(5).map(Number);
    process.send!(await train(c, rank, size, port));
    return;
  }
  // Every rank a process of its own on one core, world size 1 too.
  const env = { ...process.env, OPENBLAS_NUM_THREADS: '1', OMP_NUM_THREADS: '1' };
  const run = (size: number, port: number) =>
    Promise.all(
      Array.from(
        { length: size },
        (_, r) =>
          new Promise<Result>((resolve, reject) => {
            const args = [String(hidden), String(layers), 'rank', String(r), String(size), String(port)];
            const child = fork(__filename, args, { env });
            child.once('message', (m) => resolve(m as Result));
            child.once('exit', (code) => code !== 0 && reject(new Error(`rank ${r} exited ${code}`)));
          }),
      ),
    );
  const [one] = await run(1, 0);
  const ranks = await run(2, await freePort());
  const two = { seconds: Math.max(...ranks.map((r) => r.seconds)), comm: Math.max(...ranks.map((r) => r.comm)) };
  const tokens = ROWS * SEQ;
  const mb = (one.params * 4) / 2 ** 20;
  process.stdout.write(
    `llama ${(one.params / 1e6).toFixed(1)}M params (${mb.toFixed(0)} MiB of fp32 gradients), global batch ${ROWS} x ${SEQ} tokens\n` +
      `world size 1: ${(tokens / one.seconds).toFixed(0)} tokens/s (${one.seconds.toFixed(2)} s/step)\n` +
      `world size 2: ${(tokens / two.seconds).toFixed(0)} tokens/s (${two.seconds.toFixed(2)} s/step), ` +
      `all-reduce + broadcast ${two.comm.toFixed(3)} s/step = ${((100 * two.comm) / two.seconds).toFixed(1)}% of the step; ` +
      `speed-up ${(one.seconds / two.seconds).toFixed(2)}x\n`,
  );
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
