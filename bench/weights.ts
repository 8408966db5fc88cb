/**
 * A policy update at size (issue #48 item 3): what one step's new weights cost to reach an
 * inference server, at Qwen3-0.6B's and Qwen3-1.7B's shapes, by each path:
 *
 *   fs fp32     the trainer writes weights/step_n in fp32 (what every step wrote before), the
 *               server reads the folder (loadHfModelAsync, as /update_weights does)
 *   fs dtype    the same in the model's dtype (bf16): what rl writes now
 *   broadcast   weight_broadcast nccl: the folder in bf16 is still written (the fallback), each unit
 *               sent over a Gloo group (WeightBroadcaster -> WeightReceiver, the real classes, in a
 *               second process) before it is written; the server loads what it received, no read
 *
 * For each: the trainer's part (write, and send), the server's read, the update (the sum: from the
 * trainer starting the version to the server holding it in memory), bytes written to disk and bytes
 * sent. The copy into the engine (`scheduler.updateWeights`) is the same for every path and left
 * out. Weights are a repeated random pattern (the bytes matter, not the values). The medians of
 * --reps runs; the folder goes to --dir (default: the OS's temporary folder), removed after.
 *
 *   node dist/bench/weights.js [--shapes 0.6b,1.7b] [--reps 3] [--bucket-mb 256] [--dir DIR]
 */
import { fork, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import * as native from '../native';
import type { ArchConfig, WeightTensor } from '../lib/model/arch';
import { resolveArchConfig } from '../lib/model/create';
import { loadHfModelAsync, writeHfModelStream } from '../lib/model/hf';
import { toHfConfig } from '../lib/model/hf-config';
import { DTYPE_BYTES, numel } from '../lib/model/safetensors';
import { tensorSpecs } from '../lib/model/tensors';
import { WeightReceiver } from '../lib/inference/server/weight-receiver';
import { WeightBroadcaster, type BroadcastServers } from '../lib/trainer/broadcast';
import { QWEN3_0_6B, QWEN3_1_7B, type BenchShape } from './shapes';

const SHAPES: Record<string, BenchShape> = { '0.6b': QWEN3_0_6B, '1.7b': QWEN3_1_7B };

function arg(name: string, dflt: string): string {
  const i = process.argv.indexOf(`--${name}`);
  return i >= 0 ? process.argv[i + 1]! : dflt;
}
const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor((xs.length - 1) / 2)]!;
const seconds = (t0: number) => (performance.now() - t0) / 1000;

type DType = 'F32' | 'BF16';

/** The model's tensors as the trainer's units: one per block, and one for everything else. */
type Entry = Omit<WeightTensor, 'data'>;

function unitsOf(a: ArchConfig, dtype: DType): Entry[][] {
  const units = new Map<string, Entry[]>();
  for (const s of tensorSpecs(a)) {
    const key = /\.layers\.(\d+)\./.exec(s.name)?.[1] ?? 'rest';
    if (!units.has(key)) units.set(key, []);
    units.get(key)!.push({ name: s.name, dtype, shape: s.shape });
  }
  return [...units.values()];
}

const PATTERN = randomBytes(1 << 22);

/** Each unit's tensors with data, one unit at a time (a trainer reads them so). */
async function* unitData(units: Entry[][], onUnit?: (u: number, t: WeightTensor[]) => Promise<void>) {
  for (let u = 0; u < units.length; u++) {
    const tensors = units[u]!.map((e) => ({
      ...e,
      data: Buffer.alloc(numel(e.shape) * DTYPE_BYTES[e.dtype], PATTERN),
    }));
    // As TrainerRuntime.writeWeights: a unit's broadcast overlaps its write.
    const sent = onUnit?.(u, tensors);
    yield tensors;
    await sent;
  }
}

interface Sample {
  trainer: number;
  read: number;
  update: number;
  written: number;
  sent: number;
}

const hfConfig = (a: ArchConfig, dtype: DType) =>
  toHfConfig(a, { bos: 0, eos: 1, pad: 0 }, dtype === 'F32' ? 'float32' : 'bfloat16') as Record<string, unknown>;

async function viaFolder(a: ArchConfig, dtype: DType, dir: string): Promise<Sample> {
  const units = unitsOf(a, dtype);
  const t0 = performance.now();
  await writeHfModelStream(dir, { config: hfConfig(a, dtype), entries: units.flat(), batches: unitData(units) });
  const trainer = seconds(t0);
  const t1 = performance.now();
  const loaded = await loadHfModelAsync(dir);
  const read = seconds(t1);
  if (loaded.tensors.length !== units.flat().length) throw new Error('the folder read back differs');
  const written = fs.statSync(path.join(dir, 'model.safetensors')).size;
  fs.rmSync(dir, { recursive: true, force: true });
  return { trainer, read, update: trainer + read, written, sent: 0 };
}

/** The receiving server: a WeightReceiver in a child process, driven over IPC in place of HTTP. */
class Receiver {
  private readonly child: ChildProcess;
  private next = 0;
  private readonly waiting = new Map<number, { ok(v: unknown): void; fail(e: Error): void }>();

  constructor(shape: string) {
    this.child = fork(__filename, ['--receiver', shape], { stdio: 'inherit' });
    this.child.on('message', (m: { id: number; ok?: unknown; error?: string }) => {
      const w = this.waiting.get(m.id);
      this.waiting.delete(m.id);
      if (m.error !== undefined) w?.fail(new Error(m.error));
      else w?.ok(m.ok);
    });
  }

  readonly servers: BroadcastServers = {
    names: ['receiver'],
    post: <T>(_i: number, route: string, body?: unknown) =>
      new Promise<T>((ok, fail) => {
        const id = this.next++;
        this.waiting.set(id, { ok: ok as (v: unknown) => void, fail });
        this.child.send({ id, route, body });
      }),
  };

  close(): void {
    this.child.kill();
  }
}

async function viaBroadcast(
  a: ArchConfig,
  dir: string,
  broadcaster: WeightBroadcaster,
  receiver: Receiver,
  version: number,
): Promise<Sample> {
  const units = unitsOf(a, 'BF16');
  const t0 = performance.now();
  const b = await broadcaster.begin(version, dir, units, receiver.servers);
  if (!b) throw new Error('no broadcast group was formed');
  await writeHfModelStream(dir, {
    config: hfConfig(a, 'BF16'),
    entries: units.flat(),
    batches: unitData(units, (u, t) => b.unit(u, t)),
  });
  const report = await b.end();
  const update = seconds(t0);
  if (report.missed.length > 0) throw new Error(`the broadcast missed: ${report.missed.join('; ')}`);
  const written = fs.statSync(path.join(dir, 'model.safetensors')).size;
  fs.rmSync(dir, { recursive: true, force: true });
  return { trainer: update, read: 0, update, written, sent: report.bytes };
}

/** `--receiver SHAPE`: the server's side, answering the broadcaster's routes. */
function runReceiver(shape: string): void {
  native.setThreads(1);
  const receiver = new WeightReceiver(resolveArchConfig(SHAPES[shape]!));
  process.on('message', (m: { id: number; route: string; body: never }) => {
    const answer = async () => {
      if (m.route === '/health') return {};
      if (m.route === '/weights/join') return receiver.join(m.body);
      if (m.route === '/weights/receive') {
        const r = await receiver.receive(m.body);
        receiver.take(r.version, (m.body as { weight_dir: string }).weight_dir); // what /update_weights does
        return r;
      }
      throw new Error(`no route ${m.route}`);
    };
    answer().then(
      (ok) => process.send!({ id: m.id, ok: ok ?? {} }),
      (e: Error) => process.send!({ id: m.id, error: e.message }),
    );
  });
}

async function main(): Promise<void> {
  if (process.argv.includes('--receiver')) return runReceiver(arg('receiver', ''));
  native.setThreads(1);
  const reps = Number(arg('reps', '3'));
  const bucketBytes = Number(arg('bucket-mb', '256')) * 2 ** 20;
  const root = fs.mkdtempSync(path.join(arg('dir', os.tmpdir()), 'prime-bench-weights-'));
  const rows: string[] = [];
  try {
    for (const shape of arg('shapes', '0.6b,1.7b').split(',')) {
      if (!SHAPES[shape])
        throw new Error(`--shapes: unknown shape ${shape} (known: ${Object.keys(SHAPES).join(', ')})`);
      const a = resolveArchConfig(SHAPES[shape]);
      const receiver = new Receiver(shape);
      const broadcaster = new WeightBroadcaster(
        { host: '127.0.0.1', port: 0, timeoutS: 600, bucketBytes, device: 'cpu' },
        { info: () => undefined, warn: (l) => process.stderr.write(`${l}\n`) },
      );
      try {
        const paths: [string, (rep: number) => Promise<Sample>][] = [
          ['fs fp32', () => viaFolder(a, 'F32', path.join(root, 'fp32'))],
          ['fs dtype (bf16)', () => viaFolder(a, 'BF16', path.join(root, 'bf16'))],
          [
            'broadcast (bf16, Gloo)',
            (rep) => viaBroadcast(a, path.join(root, 'bcast'), broadcaster, receiver, rep + 1),
          ],
        ];
        for (const [name, run] of paths) {
          const samples: Sample[] = [];
          for (let rep = 0; rep < reps; rep++) samples.push(await run(rep));
          const m = (k: keyof Sample) => median(samples.map((s) => s[k]));
          const gb = (n: number) => (n / 1e9).toFixed(2);
          const row = `| ${shape} | ${name} | ${m('trainer').toFixed(2)} | ${m('read').toFixed(2)} | ${m('update').toFixed(2)} | ${gb(m('written'))} | ${gb(m('sent'))} |`;
          rows.push(row);
          process.stdout.write(`${row}\n`);
        }
      } finally {
        receiver.close();
      }
    }
  } finally {
    fs.rmSync(root, { recursive: true, force: true });
  }
  process.stdout.write(
    `\n| shape | path | trainer s | server read s | update s | GB written | GB sent |\n| --- | --- | --- | --- | --- | --- | --- |\n${rows.join('\n')}\n`,
  );
  process.exit(0);
}

main().catch((e) => {
  process.stderr.write(`${(e as Error).stack}\n`);
  process.exit(1);
});
