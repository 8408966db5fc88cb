/**
 * Data-parallel trainer throughput and memory: the same global batch trained by one process
 * (world size 1) and by 2 and 4 ranks over Gloo, each sharding mode (ZeRO-1 `optimizer`, `full`),
 * every rank a process on one core (one ATen thread, OPENBLAS_NUM_THREADS=1). Prints tokens/s of
 * the whole step, the bytes each rank holds (the engine's own accounting: parameters, gradients,
 * AdamW state, the most gathered at once), and the step's collective time: how long some
 * collective ran, how long the step waited for one, and the share that ran behind compute.
 *   npm run build:ts && node dist/bench/dist.js [hidden_size] [layers] [world sizes, e.g. 1,2,4]
 */
import { fork } from 'node:child_process';
import type { ArchConfig } from '../lib/model/arch';
import { packRow, randomTokens, randomWeights } from '../lib/model/testing';
import { Rng } from '../lib/model/rng';
import { freePort } from '../lib/net';
import { shardRows } from '../lib/trainer/runtime';
import * as native from '../native';
import { loadModel } from '../lib/model/engine';

const ROWS = 8,
  SEQ = 512,
  STEPS = 3;

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
  exposed: number;
  params: number;
  memory: native.TrainerMemory;
}

/** Trains STEPS steps (after one warm-up) as `rank` of `size`; per-step means. */
async function train(c: ArchConfig, rank: number, size: number, port: number, sharding: native.Sharding) {
  native.setThreads(1);
  const model = await loadModel(c, randomWeights(c, 1));
  const trainer = model.createTrainer();
  if (size > 1) {
    const store = await native.createStore({ host: '127.0.0.1', port, isServer: rank === 0, timeoutS: 60 });
    const group = await native.createGroup(store, { prefix: 'bench/', rank, size, timeoutS: 300 });
    trainer.setGroup(group, { bucketBytes: 25 * 1024 * 1024, sharding });
  }
  const rows = shardRows(batch(c), rank, size);
  await trainer.step(rows, { lr: 1e-4, maxGradNorm: 1 });
  await trainer.memory(); // resets the gathered peak
  let seconds = 0,
    comm = 0,
    exposed = 0;
  for (let i = 0; i < STEPS; i++) {
    const s = await trainer.step(rows, { lr: 1e-4, maxGradNorm: 1 });
    seconds += s.seconds;
    comm += s.commSeconds;
    exposed += s.commExposedSeconds;
  }
  const memory = await trainer.memory();
  return {
    seconds: seconds / STEPS,
    comm: comm / STEPS,
    exposed: exposed / STEPS,
    params: model.numParameters,
    memory,
  };
}

async function main(): Promise<void> {
  const [hidden, layers] = [Number(process.argv[2] ?? 256), Number(process.argv[3] ?? 4)];
  const c = config(hidden, layers);
  if (process.argv[4] === 'rank') {
    const [rank, size, port] = process.argv.slice(5, 8).map(Number);
    process.send!(await train(c, rank, size, port, process.argv[8] as native.Sharding));
    return;
  }
  const sizes = (process.argv[4] ?? '1,2,4').split(',').map(Number);
  const env = { ...process.env, OPENBLAS_NUM_THREADS: '1', OMP_NUM_THREADS: '1' };
  const run = async (size: number, sharding: native.Sharding) => {
    const port = await freePort();
    return Promise.all(
      Array.from(
        { length: size },
        (_, r) =>
          new Promise<Result>((resolve, reject) => {
            const args = [String(hidden), String(layers), 'rank', String(r), String(size), String(port), sharding];
            const child = fork(__filename, args, { env });
            child.once('message', (m) => resolve(m as Result));
            child.once('exit', (code) => code !== 0 && reject(new Error(`rank ${r} exited ${code}`)));
          }),
      ),
    );
  };
  const tokens = ROWS * SEQ;
  const MiB = (b: number) => (b / 2 ** 20).toFixed(1).padStart(7);
  const lines: string[] = [];
  let params = 0;
  for (const size of sizes)
    for (const sharding of size === 1 ? (['optimizer'] as const) : native.SHARDINGS) {
      const ranks = await run(size, sharding);
      params = ranks[0].params;
      // The slowest rank's step and collectives; the largest rank's bytes.
      const seconds = Math.max(...ranks.map((r) => r.seconds));
      const worst = ranks.reduce((a, b) => (b.seconds > a.seconds ? b : a));
      const most = (k: keyof native.TrainerMemory) => Math.max(...ranks.map((r) => r.memory[k]));
      const hidden = worst.comm > 0 ? Math.max(0, (100 * (worst.comm - worst.exposed)) / worst.comm) : 0;
      lines.push(
        `| ${size} | ${size === 1 ? '-' : sharding} | ${(tokens / seconds).toFixed(0)} | ${seconds.toFixed(2)} | ` +
          `${MiB(most('parameterBytes'))} | ${MiB(most('gradientBytes'))} | ${MiB(most('optimizerBytes'))} | ` +
          `${MiB(most('gatheredPeakBytes'))} | ${worst.comm.toFixed(3)} | ${worst.exposed.toFixed(3)} | ${hidden.toFixed(0)}% |`,
      );
    }
  process.stdout.write(
    `llama ${(params / 1e6).toFixed(1)}M params, global batch ${ROWS} x ${SEQ} tokens, one core per rank\n` +
      `| world size | sharding | tokens/s | s/step | params MiB | grads MiB | AdamW MiB | gathered MiB | collectives s/step | waited s/step | hidden |\n` +
      `| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |\n` +
      `${lines.join('\n')}\n`,
  );
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
