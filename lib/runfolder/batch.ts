/**
 * Training batches on disk: one safetensors file per step (the format model weights use), holding
 * the packed rows as [rows, seq_len] tensors plus the sample lengths of every row, so the trainer
 * can keep attention inside samples. Counts and step go into the header metadata. With router
 * replay, `routes` [rows, seq_len, sparse layers x experts per token] holds the experts inference
 * routed each token to, as I16 (-1 where unknown): half the bytes of I32, and expert ids fit.
 * With cross-entropy terms (echo, sft distillation), `ce_weights` [rows, seq_len] F32 holds each
 * token's weight.
 */
import { createHash } from 'node:crypto';
import { RunFolderDamagedError } from '../failures';
import { readSafetensors, writeSafetensors, type StoredTensor } from '../model/safetensors';
import type { PackCounts, PackedRow } from './packing';

/**
 * A packed row as the trainer reads it back: its samples' tokens only (the padding to seq_len that
 * the fixed-shape tensors need stays on disk, so no one computes over it). Which input sample went
 * where is not stored.
 */
export type BatchRow = Omit<PackedRow, 'sampleIndices'>;

export interface Batch {
  step: number;
  seqLen: number;
  rows: BatchRow[];
  counts: PackCounts;
}

const bytes = (a: ArrayBufferView) => Buffer.from(a.buffer, a.byteOffset, a.byteLength);

function stack<T extends Int32Array | Int16Array | Uint8Array | Float32Array>(
  parts: readonly ArrayLike<number>[],
  make: (n: number) => T,
): T {
  const out = make(parts.reduce((n, p) => n + p.length, 0));
  let at = 0;
  for (const p of parts) {
    out.set(p, at);
    at += p.length;
  }
  return out;
}

/** Writes a step's packed rows atomically. */
export function writeBatch(
  file: string,
  step: number,
  seqLen: number,
  rows: readonly PackedRow[],
  counts: PackCounts,
): void {
  const r = rows.length;
  const shape = [r, seqLen];
  const rowOffsets = new Int32Array(r + 1);
  rows.forEach((row, i) => (rowOffsets[i + 1] = rowOffsets[i] + row.sampleLengths.length));
  const tensors: StoredTensor[] = [
    {
      name: 'input_ids',
      dtype: 'I32',
      shape,
      data: bytes(
        stack(
          rows.map((x) => x.inputIds),
          (n) => new Int32Array(n),
        ),
      ),
    },
    {
      name: 'position_ids',
      dtype: 'I32',
      shape,
      data: bytes(
        stack(
          rows.map((x) => x.positionIds),
          (n) => new Int32Array(n),
        ),
      ),
    },
    {
      name: 'loss_mask',
      dtype: 'U8',
      shape,
      data: bytes(
        stack(
          rows.map((x) => x.lossMask),
          (n) => new Uint8Array(n),
        ),
      ),
    },
    {
      name: 'logprobs',
      dtype: 'F32',
      shape,
      data: bytes(
        stack(
          rows.map((x) => x.logprobs),
          (n) => new Float32Array(n),
        ),
      ),
    },
    {
      name: 'advantages',
      dtype: 'F32',
      shape,
      data: bytes(
        stack(
          rows.map((x) => x.advantages),
          (n) => new Float32Array(n),
        ),
      ),
    },
    {
      name: 'sample_lengths',
      dtype: 'I32',
      shape: [rowOffsets[r]],
      data: bytes(
        stack(
          rows.map((x) => x.sampleLengths),
          (n) => new Int32Array(n),
        ),
      ),
    },
    { name: 'row_offsets', dtype: 'I32', shape: [r + 1], data: bytes(rowOffsets) },
  ];
  const weighted = rows.filter((x) => x.ceWeights);
  if (weighted.length > 0) {
    if (weighted.length !== r) throw new Error(`${file}: some rows have cross-entropy weights and some do not`);
    tensors.push({
      name: 'ce_weights',
      dtype: 'F32',
      shape,
      data: bytes(
        stack(
          rows.map((x) => x.ceWeights!),
          (n) => new Float32Array(n),
        ),
      ),
    });
  }
  const routed = rows.filter((x) => x.routes);
  if (routed.length > 0) {
    if (routed.length !== r) throw new Error(`${file}: some rows have routes and some do not`);
    const width = rows[0].routes!.length / seqLen;
    // An Int16Array wraps larger values silently: check the expert ids fit.
    for (const x of rows)
      for (const e of x.routes!)
        if (e < -1 || e > 0x7fff) throw new Error(`${file}: route ${e} does not fit a batch's I16 routes`);
    const routes = stack(
      rows.map((x) => x.routes!),
      (n) => new Int16Array(n),
    );
    tensors.push({ name: 'routes', dtype: 'I16', shape: [r, seqLen, width], data: bytes(routes) });
  }
  writeSafetensors(file, tensors, {
    step: String(step),
    seq_len: String(seqLen),
    counts: JSON.stringify(counts),
    sha256: tensorsSha256(tensors),
  });
}

/**
 * The checksum a batch carries in its header: sha256 over its tensors' names and bytes in name
 * order. A flipped or lost byte makes the trainer's replay find the batch damaged instead of
 * training on it (batches written before it existed carry none).
 */
function tensorsSha256(tensors: readonly { name: string; data: Uint8Array }[]): string {
  const hash = createHash('sha256');
  for (const t of [...tensors].sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0))) {
    hash.update(t.name);
    hash.update(t.data);
  }
  return hash.digest('hex');
}

/**
 * Reads a batch written by `writeBatch`. A batch that is gone, or that is not one (truncated,
 * corrupt: its checksum or shapes disagree) is a `RunFolderDamagedError` naming the file: retrying
 * reads the same bytes; the trainer rebuilds it from the step's rollouts where they are kept.
 */
export function readBatch(file: string): Batch {
  try {
    return parseBatch(file);
  } catch (e) {
    const code = (e as NodeJS.ErrnoException).code;
    if (code === 'ENOENT') throw new RunFolderDamagedError(file, 'the file is gone');
    if (code !== undefined || e instanceof RunFolderDamagedError) throw e; // an I/O error may pass: retried
    throw new RunFolderDamagedError(file, (e as Error).message.replace(`${file}: `, ''));
  }
}

function parseBatch(file: string): Batch {
  const { tensors, metadata } = readSafetensors(file);
  if (metadata.sha256 !== undefined && tensorsSha256(tensors) !== metadata.sha256)
    throw new Error(`its tensors do not match the checksum in its header (corrupt)`);
  const byName = new Map(tensors.map((t) => [t.name, t]));
  const get = (name: string, dtype: StoredTensor['dtype']) => {
    const t = byName.get(name);
    if (!t) throw new Error(`${file}: batch has no tensor '${name}'`);
    if (t.dtype !== dtype) throw new Error(`${file}: batch tensor '${name}' is ${t.dtype}, expected ${dtype}`);
    // Copy into aligned memory: a Buffer slice may start at an offset typed arrays cannot view.
    const copy = new Uint8Array(t.data.length);
    copy.set(t.data);
    return copy.buffer;
  };
  const seqLen = Number(metadata.seq_len);
  const offsets = new Int32Array(get('row_offsets', 'I32'));
  const rowCount = offsets.length - 1;
  const ids = new Int32Array(get('input_ids', 'I32'));
  const pos = new Int32Array(get('position_ids', 'I32'));
  const mask = new Uint8Array(get('loss_mask', 'U8'));
  const lp = new Float32Array(get('logprobs', 'F32'));
  const adv = new Float32Array(get('advantages', 'F32'));
  const lengths = new Int32Array(get('sample_lengths', 'I32'));
  if (!(seqLen > 0) || ids.length !== rowCount * seqLen)
    throw new Error(`${file}: batch tensors do not match ${rowCount} rows of seq_len ${metadata.seq_len}`);
  const ce = byName.has('ce_weights') ? new Float32Array(get('ce_weights', 'F32')) : undefined;
  if (ce && ce.length !== rowCount * seqLen)
    throw new Error(`${file}: batch tensor 'ce_weights' does not match ${rowCount} rows of seq_len ${seqLen}`);
  const routes = byName.has('routes') ? new Int16Array(get('routes', 'I16')) : undefined;
  const width = routes ? byName.get('routes')!.shape[2] : 0;
  if (routes && (!(width > 0) || routes.length !== rowCount * seqLen * width))
    throw new Error(`${file}: batch tensor 'routes' is not [${rowCount}, ${seqLen}, width]`);
  const rows: BatchRow[] = [];
  for (let r = 0; r < rowCount; r++) {
    const sampleLengths = lengths.subarray(offsets[r], offsets[r + 1]);
    const used = sampleLengths.reduce((n, len) => n + len, 0);
    if (used > seqLen) throw new Error(`${file}: row ${r} holds ${used} sample tokens, more than seq_len ${seqLen}`);
    const span = [r * seqLen, r * seqLen + used] as const;
    rows.push({
      inputIds: ids.subarray(...span),
      positionIds: pos.subarray(...span),
      lossMask: mask.subarray(...span),
      logprobs: lp.subarray(...span),
      advantages: adv.subarray(...span),
      ...(ce ? { ceWeights: ce.subarray(...span) } : {}),
      sampleLengths,
      ...(routes ? { routes: Int32Array.from(routes.subarray(span[0] * width, span[1] * width)) } : {}),
    });
  }
  return { step: Number(metadata.step), seqLen, rows, counts: JSON.parse(metadata.counts) as PackCounts };
}
