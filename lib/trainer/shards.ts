/**
 * Writing and loading a trainer's checkpoint folder (checkpoint.ts), plain or sharded.
 *
 * Sharded checkpoints (trainer.dist.sharding = "full", full fine-tuning): no rank ever holds the
 * whole model's state. The model's parameters lie in units (the embedding, each decoder layer, the
 * final norm, an untied LM head: native/src/fsdp.h), each a flat buffer of its parameters back to
 * back (`ShardLayout`), of which each rank holds one range (`native.shardRange`, the engine's rule).
 *
 *   - `shard-<r>-of-<N>.safetensors`: rank r's part of every unit, `<unit>/param`,
 *     `<unit>/exp_avg`, `<unit>/exp_avg_sq` (master weights and AdamW's moments, 1-D [S], zeros
 *     past n), written by rank r.
 *   - `index.json`: the world size, the dtype and each unit's parameters (names, shapes, offsets).
 *   - `trainer.ckpt`: the rest (step, RNG, each parameter's AdamW step count), by rank 0.
 *
 * A trainer of any world size, sharded or not, reads back exactly the elements it holds from the
 * files that have them: the checkpoint is resharded on load.
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import * as native from '../../native';
import type { ArchConfig, TensorDType } from '../model/arch';
import { writeDirAtomicAsync, writeFileAtomic } from '../atomic';
import { CKPT_FILE, fileSha256, PROGRESS_FILE, verifyCheckpoint, type CheckpointMeta } from '../runfolder/checkpoint';
import {
  DTYPE_BYTES,
  locateSafetensorsDir,
  readFileRange,
  readSafetensorsIndex,
  writeSafetensorsStream,
  type TensorLocation,
} from '../model/safetensors';
import { checkModelTensors, isIgnorable } from '../model/tensors';

export const SHARD_INDEX = 'index.json';
export const shardFile = (rank: number, worldSize: number) => `shard-${rank}-of-${worldSize}.safetensors`;

const KINDS = ['param', 'exp_avg', 'exp_avg_sq'] as const;

export interface ShardIndex {
  format: 'prime-rl.shards.v1';
  worldSize: number;
  dtype: TensorDType;
  units: native.ShardLayout['units'];
}

/** The ranks of `worldSize` holding any of elements [begin, end) of a unit of `numel`, and their ranges. */
function holders(numel: number, worldSize: number, begin: number, end: number) {
  return Array.from({ length: worldSize }, (_, rank) => ({
    rank,
    ...native.shardRange(numel, rank, worldSize),
  })).filter((h) => h.begin < end && h.end > begin);
}

export function shardIndex(layout: native.ShardLayout): ShardIndex {
  return { format: 'prime-rl.shards.v1', worldSize: layout.worldSize, dtype: layout.dtype, units: layout.units };
}

/**
 * Writes this rank's shard file into `dir` (every rank writes its own), unit by unit as the
 * trainer hands them over; returns its name and sha256.
 */
export async function writeShardFile(trainer: native.Trainer, dir: string): Promise<{ file: string; sha256: string }> {
  const layout = trainer.shardLayout();
  const file = shardFile(layout.rank, layout.worldSize);
  const entries = layout.units.flatMap((u) =>
    KINDS.map((kind) => ({
      name: `${u.name}/${kind}`,
      dtype: layout.dtype,
      shape: [native.shardRange(u.numel, layout.rank, layout.worldSize).shardNumel],
    })),
  );
  async function* units() {
    for (let u = 0; u < layout.units.length; u++) {
      const parts = await trainer.readShard(u);
      yield parts.map((t, k) => ({ ...t, name: `${layout.units[u].name}/${KINDS[k]}` }));
    }
  }
  const sha256 = await writeSafetensorsStream(path.join(dir, file), entries, units());
  return { file, sha256 };
}

/** The checkpoint's index; throws naming what does not match this trainer's model. */
export function readShardIndex(dir: string, layout: native.ShardLayout): ShardIndex {
  const file = path.join(dir, SHARD_INDEX);
  const index = JSON.parse(fs.readFileSync(file, 'utf8')) as ShardIndex;
  if (index.format !== 'prime-rl.shards.v1' || !(index.worldSize >= 1))
    throw new Error(`${file}: not a prime-rl sharded checkpoint index`);
  if (index.dtype !== layout.dtype)
    throw new Error(`${file}: written in ${index.dtype}, this trainer's master weights are ${layout.dtype}`);
  const ours = JSON.stringify(layout.units);
  if (JSON.stringify(index.units) !== ours) {
    const differ = index.units.find((u, i) => JSON.stringify(u) !== JSON.stringify(layout.units[i]));
    throw new Error(
      `${file}: its units do not match the model (${differ ? `unit '${differ.name}'` : `${index.units.length} units, the model has ${layout.units.length}`})`,
    );
  }
  return index;
}

/** The shard files holding any of the elements this trainer reads. */
export function shardFilesRead(index: ShardIndex, layout: native.ShardLayout): string[] {
  const ranks = new Set<number>();
  for (const u of index.units) {
    const { begin, end } = native.shardRange(u.numel, layout.rank, layout.worldSize);
    for (const h of holders(u.numel, index.worldSize, begin, end)) ranks.add(h.rank);
  }
  return [...ranks].sort((a, b) => a - b).map((r) => shardFile(r, index.worldSize));
}

/**
 * Reads this trainer's elements of every unit from the shard files that hold them and stages them
 * (`stageShard`) for the `load` of trainer.ckpt that follows.
 */
export async function stageShards(trainer: native.Trainer, dir: string, index: ShardIndex): Promise<void> {
  const layout = trainer.shardLayout();
  const bytes = DTYPE_BYTES[index.dtype];
  const headers = new Map<number, Map<string, TensorLocation>>();
  const located = (rank: number, name: string): TensorLocation => {
    const file = path.join(dir, shardFile(rank, index.worldSize));
    if (!headers.has(rank)) headers.set(rank, new Map(readSafetensorsIndex(file).tensors.map((t) => [t.name, t])));
    const t = headers.get(rank)!.get(name);
    if (!t) throw new Error(`${file}: no tensor '${name}'`);
    return t;
  };
  for (let u = 0; u < index.units.length; u++) {
    const unit = index.units[u];
    const { begin, end } = native.shardRange(unit.numel, layout.rank, layout.worldSize);
    const parts = KINDS.map((kind) => {
      const data = Buffer.alloc((end - begin) * bytes);
      for (const h of holders(unit.numel, index.worldSize, begin, end)) {
        const a = Math.max(begin, h.begin),
          b = Math.min(end, h.end);
        const t = located(h.rank, `${unit.name}/${kind}`);
        if (t.shape[0] !== h.shardNumel || t.dtype !== index.dtype)
          throw new Error(
            `${shardFile(h.rank, index.worldSize)}: '${unit.name}/${kind}' is not ${index.dtype}[${h.shardNumel}]`,
          );
        const file = path.join(dir, shardFile(h.rank, index.worldSize));
        readFileRange(file, t.begin + (a - h.begin) * bytes, (b - a) * bytes).copy(data, (a - begin) * bytes);
      }
      return { name: kind, dtype: index.dtype, shape: [end - begin], data };
    });
    await trainer.stageShard(u, parts);
  }
}

/**
 * Loads checkpoint `dir` into `trainer`, plain (trainer.ckpt alone) or sharded (resharded to this
 * trainer's world size), once the checksums of the files it reads are checked; returns its
 * progress.json. A bad checkpoint throws and leaves the trainer as it was.
 */
export async function loadCheckpoint(trainer: native.Trainer, dir: string): Promise<CheckpointMeta> {
  if (!fs.existsSync(path.join(dir, SHARD_INDEX))) {
    const meta = verifyCheckpoint(dir);
    await trainer.load(dir);
    return meta;
  }
  const layout = trainer.shardLayout();
  const index = readShardIndex(dir, layout);
  const read = new Set([SHARD_INDEX, ...shardFilesRead(index, layout)]);
  const meta = verifyCheckpoint(dir, (file) => read.has(file));
  await stageShards(trainer, dir, index);
  await trainer.load(dir);
  return meta;
}

/**
 * Writes checkpoint `dir` of `trainer`, rank `rank` of its group (0 without one): a collective
 * where the trainer has a group. Rank 0 writes trainer.ckpt and progress.json (with `meta`) into
 * a temp folder, renamed to `dir` once complete. Sharded, every rank first writes its shard file
 * and its checksum into `<dir>.shards/`, which rank 0 moves in once all are there.
 */
export async function writeCheckpoint(
  trainer: native.Trainer,
  dir: string,
  rank: number,
  meta: Omit<CheckpointMeta, 'sha256' | 'files'>,
): Promise<void> {
  const layout = trainer.shardLayout();
  const parts = `${dir}.shards`;
  if (layout.sharded) {
    fs.mkdirSync(parts, { recursive: true });
    const { file, sha256 } = await writeShardFile(trainer, parts);
    writeFileAtomic(path.join(parts, `${file}.sha256`), sha256);
  }
  if (rank > 0) {
    await trainer.save('');
    return;
  }
  await writeDirAtomicAsync(dir, async (tmp) => {
    // A collective: once it returns, every rank's shard file is in `parts`.
    await trainer.save(tmp);
    const files: Record<string, string> = {};
    if (layout.sharded) {
      for (let r = 0; r < layout.worldSize; r++) {
        const file = shardFile(r, layout.worldSize);
        files[file] = fs.readFileSync(path.join(parts, `${file}.sha256`), 'utf8');
        fs.renameSync(path.join(parts, file), path.join(tmp, file));
      }
      writeFileAtomic(path.join(tmp, SHARD_INDEX), JSON.stringify(shardIndex(layout)));
      files[SHARD_INDEX] = fileSha256(path.join(tmp, SHARD_INDEX));
    }
    const sha256 = fileSha256(path.join(tmp, CKPT_FILE));
    const full: CheckpointMeta = { ...meta, sha256, ...(layout.sharded ? { files } : {}) };
    writeFileAtomic(path.join(tmp, PROGRESS_FILE), JSON.stringify(full, null, 1));
  });
  fs.rmSync(parts, { recursive: true, force: true });
}

/**
 * The base weights of a fully sharded trainer whose model was built without them
 * (`createModelWithoutWeights`): for each unit, only the bytes of each parameter that fall in this
 * rank's range are read from the HF folder `dir`, so no rank reads or holds the whole model.
 */
export async function loadBaseShards(trainer: native.Trainer, dir: string, config: ArchConfig): Promise<void> {
  const located = locateSafetensorsDir(dir);
  checkModelTensors(
    config,
    [...located.values()].filter((t) => !isIgnorable(t.name, config)),
    dir,
  );
  const layout = trainer.shardLayout();
  for (let u = 0; u < layout.units.length; u++) {
    const unit = layout.units[u];
    const { begin, end } = native.shardRange(unit.numel, layout.rank, layout.worldSize);
    const parts = unit.params.flatMap((p) => {
      const numel = p.shape.reduce((x, y) => x * y, 1);
      const a = Math.max(begin, p.offset),
        b = Math.min(end, p.offset + numel);
      if (a >= b) return [];
      const t = located.get(p.name)!;
      const bytes = DTYPE_BYTES[t.dtype];
      const data = readFileRange(t.file, t.begin + (a - p.offset) * bytes, (b - a) * bytes);
      return [{ offset: a, tensor: { name: p.name, dtype: t.dtype as TensorDType, shape: [b - a], data } }];
    });
    await trainer.loadBaseShard(u, parts);
  }
}
