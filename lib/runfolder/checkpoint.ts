/**
 * A trainer checkpoint folder, `checkpoints/step_N/`: `trainer.ckpt` (model and optimizer state,
 * written by the native engine; under full sharding the rest, with the shards of lib/trainer/shards.ts
 * beside it) and `progress.json` (the trainer's counters and the sha256 of every file, so a torn or
 * bit-rotted checkpoint is detected before it is loaded). No native code here: the cpu worker checks
 * checkpoints too (`ckpt.resume_step`).
 */
import * as crypto from 'node:crypto';
import * as fs from 'node:fs';
import * as path from 'node:path';

export const CKPT_FILE = 'trainer.ckpt';
export const PROGRESS_FILE = 'progress.json';

export interface CheckpointMeta {
  /** Train steps applied. */
  steps: number;
  samples: number;
  tokens: number;
  /** The KL penalty's beta for the next step (absent: written without a KL penalty). */
  klBeta?: number;
  /** sha256 of trainer.ckpt. */
  sha256: string;
  /** sha256 of the checkpoint's other files by name (a sharded checkpoint's index and shards). */
  files?: Record<string, string>;
}

/** sha256 of a file, read in chunks (checkpoints can exceed what one Buffer holds). */
export function fileSha256(file: string): string {
  const hash = crypto.createHash('sha256');
  const fd = fs.openSync(file, 'r');
  try {
    const chunk = Buffer.allocUnsafe(8 << 20);
    for (let n; (n = fs.readSync(fd, chunk, 0, chunk.length, null)) > 0;) hash.update(chunk.subarray(0, n));
  } finally {
    fs.closeSync(fd);
  }
  return hash.digest('hex');
}

/** What checkpoint `dir` records (progress.json), unchecked. */
export function readCheckpointMeta(dir: string): CheckpointMeta {
  return JSON.parse(fs.readFileSync(path.join(dir, PROGRESS_FILE), 'utf8')) as CheckpointMeta;
}

/**
 * What checkpoint `dir` records, once the checksums of trainer.ckpt and of its other files are
 * checked (`only`: of those of them a reader needs, e.g. the shards one rank reads); throws saying
 * what is wrong with it.
 */
export function verifyCheckpoint(dir: string, only?: (file: string) => boolean): CheckpointMeta {
  const meta = readCheckpointMeta(dir);
  const check = (file: string, expected: string) => {
    const actual = fileSha256(path.join(dir, file));
    if (actual !== expected)
      throw new Error(`${file}: checksum mismatch (${actual.slice(0, 12)} != ${String(expected).slice(0, 12)})`);
  };
  check(CKPT_FILE, meta.sha256);
  for (const [file, sha256] of Object.entries(meta.files ?? {})) if (!only || only(file)) check(file, sha256);
  return meta;
}
