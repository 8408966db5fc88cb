/**
 * safetensors reader and writer (Hugging Face's tensor file format).
 *
 * Layout: an 8-byte little-endian u64 N, then N bytes of JSON header
 * `{name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__"?: {str: str}}`, then the data
 * region; offsets are relative to the start of the data region. No maintained JS library exists, so
 * this file parses and validates the format itself, as strictly as the reference (Rust)
 * implementation: tensors must tile the data region exactly, without gaps or overlaps.
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import { constants as bufferConstants } from 'node:buffer';
import { createHash, randomBytes } from 'node:crypto';
import type { DiskDType, WeightTensor } from './arch';
import { writeFileAtomic } from '../atomic';
import { readBoundedText } from '../files';
import { jsonSyntaxError, MAX_JSON_FILE_BYTES } from '../json';

/**
 * The safetensors dtypes this module reads and writes. Model weights use the float ones
 * (`DiskDType`); training batches also store integer ids and masks.
 */
export type SafetensorsDType = DiskDType | 'F64' | 'I64' | 'I32' | 'I16' | 'I8' | 'U8' | 'BOOL';

export const DTYPE_BYTES: Record<SafetensorsDType, number> = {
  F64: 8,
  F32: 4,
  F16: 2,
  BF16: 2,
  I64: 8,
  I32: 4,
  I16: 2,
  I8: 1,
  U8: 1,
  BOOL: 1,
};

/** A tensor's name, dtype and shape: what a safetensors header lists before its data exists. */
export interface TensorEntry {
  name: string;
  dtype: SafetensorsDType;
  shape: number[];
}

/** Any tensor of a safetensors file: raw little-endian bytes. */
export interface StoredTensor {
  name: string;
  dtype: SafetensorsDType;
  shape: number[];
  data: Buffer;
}

const MODEL_DTYPES: readonly string[] = ['F32', 'F16', 'BF16'] satisfies DiskDType[];

/** The reference implementation refuses headers above 100 MB; a larger one means a corrupt file. */
const MAX_HEADER_BYTES = 100_000_000;

export const INDEX_FILE = 'model.safetensors.index.json';

export interface SafetensorsFile {
  tensors: StoredTensor[];
  metadata: Record<string, string>;
}

interface HeaderEntry {
  name: string;
  dtype: SafetensorsDType;
  shape: number[];
  begin: number;
  end: number;
}

function isSafetensorsDType(s: unknown): s is SafetensorsDType {
  return typeof s === 'string' && Object.prototype.hasOwnProperty.call(DTYPE_BYTES, s);
}

function isNonNegInt(x: unknown): x is number {
  return typeof x === 'number' && Number.isSafeInteger(x) && x >= 0;
}

export function numel(shape: readonly number[]): number {
  return shape.reduce((a, b) => a * b, 1);
}

/** Validates the JSON header against the data region's length; returns entries sorted by offset. */
function parseHeader(
  headerBytes: Buffer,
  dataLength: number,
  source: string,
): { entries: HeaderEntry[]; metadata: Record<string, string> } {
  const text = headerBytes.toString('utf8');
  if (!text.startsWith('{')) throw new Error(`${source}: safetensors header does not start with '{'`);
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch (e) {
    throw new Error(`${source}: safetensors header is not valid JSON (${jsonSyntaxError(e, text)})`);
  }
  // Valid JSON that starts with '{' is an object.
  const metadata: Record<string, string> = {};
  const entries: HeaderEntry[] = [];
  for (const [name, value] of Object.entries(parsed as Record<string, unknown>)) {
    if (name === '__metadata__') {
      if (value === null || typeof value !== 'object' || Array.isArray(value)) {
        throw new Error(`${source}: __metadata__ must be an object of strings`);
      }
      for (const [k, v] of Object.entries(value as Record<string, unknown>)) {
        if (typeof v !== 'string') throw new Error(`${source}: __metadata__.${k} is not a string`);
        metadata[k] = v;
      }
      continue;
    }
    const where = `${source}: tensor '${name}'`;
    if (value === null || typeof value !== 'object') throw new Error(`${where}: entry is not an object`);
    const { dtype, shape, data_offsets: offsets } = value as Record<string, unknown>;
    if (!isSafetensorsDType(dtype)) {
      throw new Error(
        `${where}: unsupported dtype ${JSON.stringify(dtype)} (supported: ${Object.keys(DTYPE_BYTES).join(', ')})`,
      );
    }
    if (!Array.isArray(shape) || !shape.every(isNonNegInt)) {
      throw new Error(`${where}: shape must be an array of non-negative integers`);
    }
    if (!Array.isArray(offsets) || offsets.length !== 2 || !offsets.every(isNonNegInt)) {
      throw new Error(`${where}: data_offsets must be [begin, end] non-negative integers`);
    }
    const [begin, end] = offsets as [number, number];
    if (begin > end || end > dataLength) {
      throw new Error(`${where}: data_offsets [${begin}, ${end}] out of range (data region is ${dataLength} bytes)`);
    }
    const expected = numel(shape) * DTYPE_BYTES[dtype];
    if (end - begin !== expected) {
      throw new Error(
        `${where}: data_offsets span ${end - begin} bytes but ${dtype}${JSON.stringify(shape)} needs ${expected}`,
      );
    }
    entries.push({ name, dtype, shape: shape as number[], begin, end });
  }
  entries.sort((a, b) => a.begin - b.begin || a.end - b.end);
  let cursor = 0;
  for (const e of entries) {
    if (e.begin < cursor) throw new Error(`${source}: tensor '${e.name}' overlaps the previous tensor`);
    if (e.begin > cursor) throw new Error(`${source}: gap in data region before tensor '${e.name}'`);
    cursor = e.end;
  }
  if (cursor !== dataLength) {
    throw new Error(`${source}: data region is ${dataLength} bytes but tensors cover only ${cursor}`);
  }
  return { entries, metadata };
}

function headerLength(prefix: Buffer, fileLength: number, source: string): number {
  if (fileLength < 8) throw new Error(`${source}: file too short for a safetensors header (${fileLength} bytes)`);
  const n = prefix.readBigUInt64LE(0);
  if (n > BigInt(MAX_HEADER_BYTES)) throw new Error(`${source}: safetensors header length ${n} is too large`);
  if (Number(n) > fileLength - 8) {
    throw new Error(`${source}: safetensors header length ${n} exceeds the file (${fileLength} bytes)`);
  }
  return Number(n);
}

/**
 * Parses an in-memory safetensors file. Tensor data are zero-copy slices of `bytes`, so they stay
 * valid only as long as nobody mutates `bytes`. `source` names the file in errors.
 */
export function parseSafetensors(bytes: Buffer, source = '<buffer>'): SafetensorsFile {
  const n = headerLength(bytes, bytes.length, source);
  const dataStart = 8 + n;
  const { entries, metadata } = parseHeader(bytes.subarray(8, dataStart), bytes.length - dataStart, source);
  const tensors = entries.map((e) => ({
    name: e.name,
    dtype: e.dtype,
    shape: e.shape,
    data: bytes.subarray(dataStart + e.begin, dataStart + e.end),
  }));
  return { tensors, metadata };
}

/**
 * Reads one safetensors file. Files that fit in one Buffer are read whole and sliced (zero-copy);
 * larger ones (multi-GB shards) are read tensor by tensor.
 */
export function readSafetensors(file: string): SafetensorsFile {
  const fd = fs.openSync(file, 'r');
  try {
    const size = fs.fstatSync(fd).size;
    if (size <= bufferConstants.MAX_LENGTH) return parseSafetensors(readExactly(fd, 0, size, file), file);
    const n = headerLength(readExactly(fd, 0, 8, file), size, file);
    const { entries, metadata } = parseHeader(readExactly(fd, 8, n, file), size - 8 - n, file);
    const tensors = entries.map((e) => ({
      name: e.name,
      dtype: e.dtype,
      shape: e.shape,
      data: readExactly(fd, 8 + n + e.begin, e.end - e.begin, file),
    }));
    return { tensors, metadata };
  } finally {
    fs.closeSync(fd);
  }
}

// Reads in flight at once for readSafetensorsAsync: libuv's thread pool has 4 threads by default.
const ASYNC_READS = 4;
const ASYNC_CHUNK = 64 << 20;

/**
 * readSafetensors without blocking the event loop (a server loading new weights keeps serving):
 * the tensors are read in 64 MiB pieces, several at once on libuv's threads, so copying a large
 * file out of the page cache also takes several cores. Same checks and errors as readSafetensors.
 */
export async function readSafetensorsAsync(file: string): Promise<SafetensorsFile> {
  const handle = await fs.promises.open(file, 'r');
  try {
    const size = (await handle.stat()).size;
    const n = headerLength(await readExactlyAsync(handle, 0, Math.min(8, size), file), size, file);
    const { entries, metadata } = parseHeader(await readExactlyAsync(handle, 8, n, file), size - 8 - n, file);
    const tensors = entries.map((e) => ({
      name: e.name,
      dtype: e.dtype,
      shape: e.shape,
      data: Buffer.allocUnsafe(e.end - e.begin),
    }));
    const pieces: { data: Buffer; at: number; position: number; length: number }[] = [];
    entries.forEach((e, i) => {
      for (let at = 0; at < e.end - e.begin; at += ASYNC_CHUNK) {
        const length = Math.min(ASYNC_CHUNK, e.end - e.begin - at);
        pieces.push({ data: tensors[i].data, at, position: 8 + n + e.begin + at, length });
      }
    });
    let next = 0;
    const reader = async () => {
      while (next < pieces.length) {
        const p = pieces[next++];
        await readIntoAsync(handle, p.data, p.at, p.position, p.length, file);
      }
    };
    await Promise.all(Array.from({ length: ASYNC_READS }, reader));
    return { tensors, metadata };
  } finally {
    await handle.close();
  }
}

/** Where a tensor's bytes lie in its file (absolute offsets). */
export interface TensorLocation extends TensorEntry {
  begin: number;
  end: number;
}

/** A safetensors file's header: its tensors and where each lies, without reading their data. */
export function readSafetensorsIndex(file: string): { tensors: TensorLocation[]; metadata: Record<string, string> } {
  const fd = fs.openSync(file, 'r');
  try {
    const size = fs.fstatSync(fd).size;
    const n = headerLength(readExactly(fd, 0, Math.min(8, size), file), size, file);
    const { entries, metadata } = parseHeader(readExactly(fd, 8, n, file), size - 8 - n, file);
    const tensors = entries.map((e) => ({ ...e, begin: 8 + n + e.begin, end: 8 + n + e.end }));
    return { tensors, metadata };
  } finally {
    fs.closeSync(fd);
  }
}

/** `length` bytes of `file` from `position`. */
export function readFileRange(file: string, position: number, length: number): Buffer {
  const fd = fs.openSync(file, 'r');
  try {
    return readExactly(fd, position, length, file);
  } finally {
    fs.closeSync(fd);
  }
}

function readExactly(fd: number, position: number, length: number, file: string): Buffer {
  const buf = Buffer.allocUnsafe(length);
  let done = 0;
  while (done < length) {
    const got = fs.readSync(fd, buf, done, length - done, position + done);
    if (got === 0) throw new Error(`${file}: unexpected end of file`);
    done += got;
  }
  return buf;
}

async function readExactlyAsync(handle: fs.promises.FileHandle, position: number, length: number, file: string) {
  const buf = Buffer.allocUnsafe(length);
  await readIntoAsync(handle, buf, 0, position, length, file);
  return buf;
}

async function readIntoAsync(
  handle: fs.promises.FileHandle,
  buf: Buffer,
  offset: number,
  position: number,
  length: number,
  file: string,
): Promise<void> {
  let done = 0;
  while (done < length) {
    const { bytesRead } = await handle.read(buf, offset + done, length - done, position + done);
    if (bytesRead === 0) throw new Error(`${file}: unexpected end of file`);
    done += bytesRead;
  }
}

/** A tensor of a file as its header describes it, before any of its data is read. */
export type TensorHeader = Omit<StoredTensor, 'data'>;

/** The tensors a safetensors file's header lists (its data is not read). */
export function readSafetensorsHeader(file: string): TensorHeader[] {
  const fd = fs.openSync(file, 'r');
  try {
    const size = fs.fstatSync(fd).size;
    const n = headerLength(readExactly(fd, 0, Math.min(8, size), file), size, file);
    return parseHeader(readExactly(fd, 8, n, file), size - 8 - n, file).entries.map(({ name, dtype, shape }) => ({
      name,
      dtype,
      shape,
    }));
  } finally {
    fs.closeSync(fd);
  }
}

/**
 * Which of a model folder's tensors to read, and in what order, chosen by their headers before any
 * data is read (index order, model dtypes only); it throws to stop the read. A folder of one 100 GB
 * tensor of the wrong name costs a header read, not 100 GB of memory.
 */
export type SelectTensors = (headers: TensorHeader[]) => readonly TensorHeader[];

/**
 * Reading a model folder, written once for the sync and the async reader: the headers first, where
 * `select` chooses (without one: every tensor, as listed), then each weight file in turn (yielded,
 * its tensors sent back), then the chosen tensors in the chosen order.
 */
function* folderRead(dir: string, select?: SelectTensors): Generator<string, WeightTensor[], StoredTensor[]> {
  const plan = weightFiles(dir);
  const chosen = select?.(
    modelTensors(
      dir,
      plan,
      plan.map((f) => readSafetensorsHeader(f.file)),
    ),
  );
  const read: StoredTensor[][] = [];
  for (const f of plan) read.push(yield f.file);
  const tensors = modelTensors(dir, plan, read);
  if (!chosen) return tensors;
  const byName = new Map(tensors.map((t) => [t.name, t]));
  return chosen.map((h) => {
    const t = byName.get(h.name);
    // The files were read twice (headers, then data): one replaced in between is not the one checked.
    if (!t || t.dtype !== h.dtype || t.shape.join() !== h.shape.join())
      throw new Error(`${dir}: tensor '${h.name}' changed while the folder was read`);
    return t;
  });
}

/**
 * Reads the weights of an HF model folder: `model.safetensors.index.json` (sharded, its
 * `weight_map` says which file holds each tensor) or else `model.safetensors`; `select` (see
 * `SelectTensors`) chooses by the headers first.
 */
export function readSafetensorsDir(dir: string, select?: SelectTensors): WeightTensor[] {
  const steps = folderRead(dir, select);
  let step = steps.next();
  while (!step.done) step = steps.next(readSafetensors(step.value).tensors);
  return step.value;
}

/** readSafetensorsDir without blocking the event loop (readSafetensorsAsync). */
export async function readSafetensorsDirAsync(dir: string, select?: SelectTensors): Promise<WeightTensor[]> {
  const steps = folderRead(dir, select);
  let step = steps.next();
  while (!step.done) step = steps.next((await readSafetensorsAsync(step.value)).tensors);
  return step.value;
}

/** Bytes of the files holding a model folder's weights (its shards, or model.safetensors), from their sizes: nothing is read. */
export function weightFilesBytes(dir: string): number {
  return weightFiles(dir).reduce((n, f) => n + fs.statSync(f.file).size, 0);
}

/**
 * Where each weight of an HF model folder lies (file and byte range), from the headers alone:
 * for a reader that takes only parts of tensors (a fully sharded trainer's rank).
 */
export function locateSafetensorsDir(dir: string): Map<string, TensorLocation & { file: string }> {
  const out = new Map<string, TensorLocation & { file: string }>();
  for (const { file, names } of weightFiles(dir)) {
    const wanted = names && new Set(names);
    for (const t of readSafetensorsIndex(file).tensors)
      if (!wanted || wanted.has(t.name)) out.set(t.name, { ...t, file });
  }
  return out;
}

/** A file of a model folder, and the tensors the index says it holds (undefined: all, no index). */
interface WeightFile {
  file: string;
  names?: string[];
}

/** Which files hold the folder's weights: its index's shards, or the single model.safetensors. */
function weightFiles(dir: string): WeightFile[] {
  const indexPath = path.join(dir, INDEX_FILE);
  if (!fs.existsSync(indexPath)) {
    const single = path.join(dir, 'model.safetensors');
    if (!fs.existsSync(single)) throw new Error(`${dir}: neither model.safetensors nor ${INDEX_FILE} exists`);
    return [{ file: single }];
  }
  const indexText = readBoundedText(indexPath, MAX_JSON_FILE_BYTES);
  let index: unknown;
  try {
    index = JSON.parse(indexText);
  } catch (e) {
    throw new Error(`${indexPath}: not valid JSON (${jsonSyntaxError(e, indexText)})`);
  }
  const weightMap = (index as { weight_map?: unknown } | null)?.weight_map;
  if (weightMap === null || typeof weightMap !== 'object' || Array.isArray(weightMap)) {
    throw new Error(`${indexPath}: missing object field 'weight_map'`);
  }
  const byShard = new Map<string, string[]>();
  for (const [name, shard] of Object.entries(weightMap as Record<string, unknown>)) {
    if (typeof shard !== 'string' || shard.includes('/') || shard.includes('\\')) {
      throw new Error(`${indexPath}: weight_map['${name}'] must be a file name in the folder`);
    }
    byShard.set(shard, [...(byShard.get(shard) ?? []), name]);
  }
  return [...byShard].map(([shard, names]) => {
    const file = path.join(dir, shard);
    if (!fs.existsSync(file)) throw new Error(`${indexPath}: shard ${shard} (holding '${names[0]}') is missing`);
    return { file, names };
  });
}

/** The tensors each index entry names, from what was read of its file (read[i] of plan[i]); model dtypes only. */
function modelTensors<T extends TensorHeader>(
  dir: string,
  plan: WeightFile[],
  read: T[][],
): (T & { dtype: DiskDType })[] {
  const out: T[] = [];
  plan.forEach(({ file, names }, i) => {
    if (names === undefined) {
      out.push(...read[i]);
      return;
    }
    const found = new Map(read[i].map((t) => [t.name, t]));
    for (const name of names) {
      const t = found.get(name);
      if (!t) throw new Error(`${file}: tensor '${name}' listed in ${INDEX_FILE} is not in the shard`);
      out.push(t);
    }
  });
  return out.map((t) => {
    if (!MODEL_DTYPES.includes(t.dtype)) {
      throw new Error(
        `${dir}: tensor '${t.name}' has dtype ${t.dtype}; model weights must be ${MODEL_DTYPES.join(', ')}`,
      );
    }
    return t as T & { dtype: DiskDType };
  });
}

/** Header JSON padded with spaces to a multiple of 8 bytes, as the reference writer does. */
function encodeHeader(tensors: readonly TensorEntry[], metadata?: Record<string, string>): Buffer {
  const header: Record<string, unknown> = {};
  if (metadata && Object.keys(metadata).length > 0) header.__metadata__ = metadata;
  let offset = 0;
  for (const t of tensors) {
    const bytes = numel(t.shape) * DTYPE_BYTES[t.dtype];
    header[t.name] = { dtype: t.dtype, shape: t.shape, data_offsets: [offset, offset + bytes] };
    offset += bytes;
  }
  const json = Buffer.from(JSON.stringify(header), 'utf8');
  const padded = Math.ceil(json.length / 8) * 8;
  const out = Buffer.alloc(8 + padded, 0x20);
  out.writeBigUInt64LE(BigInt(padded), 0);
  json.copy(out, 8);
  return out;
}

/** Checks names are unique and valid and dtypes supported; returns the entries sorted by name. */
function checkedEntries<T extends TensorEntry>(tensors: readonly T[], target: string): T[] {
  const sorted = [...tensors].sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
  for (let i = 0; i < sorted.length; i++) {
    const t = sorted[i];
    if (i > 0 && sorted[i - 1].name === t.name) throw new Error(`${target}: duplicate tensor '${t.name}'`);
    if (t.name === '__metadata__') throw new Error(`${target}: '__metadata__' is not a valid tensor name`);
    if (!isSafetensorsDType(t.dtype)) throw new Error(`${target}: tensor '${t.name}' has unsupported dtype ${t.dtype}`);
  }
  return sorted;
}

/** checkedEntries, and every buffer matches its dtype and shape. */
function checkedSorted(tensors: readonly StoredTensor[], target: string): StoredTensor[] {
  const sorted = checkedEntries(tensors, target);
  for (const t of sorted) {
    const expected = numel(t.shape) * DTYPE_BYTES[t.dtype];
    if (t.data.length !== expected) {
      throw new Error(
        `${target}: tensor '${t.name}' has ${t.data.length} bytes but ${t.dtype}${JSON.stringify(t.shape)} needs ${expected}`,
      );
    }
  }
  return sorted;
}

/** Serialises tensors (sorted by name) into one in-memory safetensors file. */
export function serializeSafetensors(tensors: readonly StoredTensor[], metadata?: Record<string, string>): Buffer {
  const sorted = checkedSorted(tensors, '<buffer>');
  return Buffer.concat([encodeHeader(sorted, metadata), ...sorted.map((t) => t.data)]);
}

/**
 * Writes a safetensors file whose tensors arrive in batches, in `entries` order (the header, written
 * first, lists them all): no more than a batch is in memory at once (a model written unit by unit as
 * a sharded trainer gathers it). Temp file, fsync, then rename; returns the file's sha256.
 */
export async function writeSafetensorsStream(
  file: string,
  entries: readonly TensorEntry[],
  batches: AsyncIterable<readonly StoredTensor[]>,
  metadata?: Record<string, string>,
): Promise<string> {
  checkedEntries(entries, file);
  const tmp = `${file}.tmp-${process.pid}-${randomBytes(4).toString('hex')}`;
  const hash = createHash('sha256');
  const fd = fs.openSync(tmp, 'w');
  try {
    const write = (b: Buffer) => {
      hash.update(b);
      for (let done = 0; done < b.length;) done += fs.writeSync(fd, b, done, b.length - done);
    };
    write(encodeHeader(entries, metadata));
    let i = 0;
    for await (const batch of batches)
      for (const t of batch) {
        const e = entries[i++];
        if (!e || t.name !== e.name || t.dtype !== e.dtype || t.data.length !== numel(e.shape) * DTYPE_BYTES[e.dtype])
          throw new Error(
            `${file}: tensor ${i - 1} is '${t.name}' (${t.dtype}, ${t.data.length} bytes), expected ${JSON.stringify(e)}`,
          );
        write(t.data);
      }
    if (i !== entries.length) throw new Error(`${file}: ${i} of ${entries.length} tensors arrived`);
    fs.fsyncSync(fd);
  } catch (e) {
    fs.closeSync(fd);
    fs.rmSync(tmp, { force: true });
    throw e;
  }
  fs.closeSync(fd);
  fs.renameSync(tmp, file);
  return hash.digest('hex');
}

/**
 * Writes a safetensors file atomically (temp file + fsync + rename), streaming the tensor buffers
 * so a multi-GB model is never concatenated in memory.
 */
export function writeSafetensors(
  file: string,
  tensors: readonly StoredTensor[],
  metadata?: Record<string, string>,
): void {
  const sorted = checkedSorted(tensors, file);
  writeFileAtomic(file, [encodeHeader(sorted, metadata), ...sorted.map((t) => t.data)]);
}
