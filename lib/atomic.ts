/**
 * Crash-safe writes of state (weights, checkpoints, batches, metrics): readers (an inference server loading
 * `weights/step_n/`, a resumed trainer) must see either the old complete content or the new
 * complete content, never a half-written file.
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import { randomBytes } from 'node:crypto';
import * as os from 'node:os';
import { NonRetryableError, RunFolderDamagedError } from './failures';

/** The name of `DiskFullError`, and so the type of the Temporal failure an activity raises with it. */
export const DISK_FULL = 'DiskFull';

/** Below this many free bytes a file system counts as full (a native writer's error names no errno code). */
const FULL_BELOW = 1024 * 1024;
/** ENOSPC and EDQUOT as the native engine's writers name them (strerror: native/src/archive_file.h). */
const NATIVE_FULL = /No space left on device|Disk quota exceeded/;

/**
 * A write that failed for want of space (ENOSPC, EDQUOT), named by its folder and what is free
 * there. Not a failure of the run: the activity fails and Temporal retries it, which succeeds once
 * space is freed; what failed was never committed (temp files are removed).
 */
export class DiskFullError extends Error {
  override readonly name = DISK_FULL;
  readonly code = 'ENOSPC';

  constructor(
    readonly dir: string,
    override readonly cause: Error,
  ) {
    super(`no space left in ${dir} (${spaceOf(dir)}): ${cause.message}; retried once space is freed`);
  }
}

/** `1.5 MiB`: a size in messages. */
export function formatBytes(n: number): string {
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  for (; n >= 1024 && i < units.length - 1; i++) n /= 1024;
  return `${i === 0 ? n : n.toFixed(1)} ${units[i]}`;
}

/** The nearest folder of `target` that exists (a write may fail before its folder is made). */
function existingFolder(target: string): string {
  let dir = path.dirname(path.resolve(target));
  while (!fs.existsSync(dir) && path.dirname(dir) !== dir) dir = path.dirname(dir);
  return dir;
}

/** Free bytes for us in `dir`'s file system, or undefined where it cannot be read. */
function freeBytes(dir: string): number | undefined {
  try {
    const s = fs.statfsSync(dir);
    return s.bavail * s.bsize;
  } catch {
    return undefined;
  }
}

function spaceOf(dir: string): string {
  try {
    const s = fs.statfsSync(dir);
    return `${formatBytes(s.bavail * s.bsize)} free of ${formatBytes(s.blocks * s.bsize)}`;
  } catch {
    return 'free space unknown';
  }
}

/**
 * `e`, a failed write of `target`, as a `DiskFullError` when the file system is full: errno ENOSPC
 * or EDQUOT, by code or (the native engine's errors carry only a message) by name, or any error
 * without an errno code while less than 1 MiB is free there; else `e` itself (a failure no retry
 * fixes stays one).
 */
export function asDiskFull(e: unknown, target: string): unknown {
  // Not `instanceof Error`: Node's own errors come from another realm under a VM (jest).
  if (typeof (e as Error | undefined)?.message !== 'string' || e instanceof NonRetryableError) return e;
  const dir = existingFolder(target);
  // Raised inside a folder being built (a temp folder): named by the folder it was to become.
  if (e instanceof DiskFullError) return new DiskFullError(dir, e.cause);
  const code = (e as NodeJS.ErrnoException).code;
  const full =
    code === 'ENOSPC' ||
    code === 'EDQUOT' ||
    (code === undefined && (NATIVE_FULL.test((e as Error).message) || (freeBytes(dir) ?? Infinity) < FULL_BELOW));
  return full ? new DiskFullError(dir, e as Error) : e;
}

/**
 * `<target>.<kind>-<host>-<pid>-<random>`: the host and pid name the writer, so a later writer can
 * tell a leftover of a killed process (same host, pid gone) from a write still in progress.
 */
function tempSibling(target: string, kind: 'tmp' | 'old'): string {
  return `${target}.${kind}-${os.hostname()}-${process.pid}-${randomBytes(4).toString('hex')}`;
}

function processAlive(pid: number): boolean {
  try {
    process.kill(pid, 0);
    return true;
  } catch (e) {
    return (e as NodeJS.ErrnoException).code === 'EPERM';
  }
}

/**
 * Removes the temp siblings of `dir` that a writer killed mid-write (SIGKILL, OOM) left behind on
 * this host: its `.tmp-*` folders always, its `.old-*` folders once `dir` itself is back. Writers on
 * other hosts sharing the folder are left alone (their pids mean nothing here).
 */
function sweepDeadSiblings(dir: string): void {
  const parent = path.dirname(path.resolve(dir));
  const base = path.basename(dir);
  const host = os.hostname();
  let names: string[];
  try {
    names = fs.readdirSync(parent);
  } catch {
    return;
  }
  for (const name of names) {
    if (!name.startsWith(`${base}.`)) continue;
    const m = /^(tmp|old)-(.+)-(\d+)-[0-9a-f]{8}$/.exec(name.slice(base.length + 1));
    if (!m || m[2] !== host || processAlive(Number(m[3]))) continue;
    if (m[1] === 'old' && !fs.existsSync(dir)) continue; // the only copy left: keep it for a person to restore
    fs.rmSync(path.join(parent, name), { recursive: true, force: true });
  }
}

function fsyncDir(dir: string): void {
  const fd = fs.openSync(dir, 'r');
  try {
    fs.fsyncSync(fd);
  } finally {
    fs.closeSync(fd);
  }
}

/**
 * Writes `chunks` to a temp file next to `file`, fsyncs it, and renames it over `file`. On a full
 * disk (`DiskFullError`) or any other failure the temp file is removed and `file` is untouched.
 */
export function writeFileAtomic(file: string, chunks: string | Buffer | readonly Buffer[]): void {
  const parts =
    typeof chunks === 'string' ? [Buffer.from(chunks, 'utf8')] : Buffer.isBuffer(chunks) ? [chunks] : chunks;
  const tmp = tempSibling(file, 'tmp');
  try {
    const fd = fs.openSync(tmp, 'w');
    try {
      for (const part of parts) {
        let done = 0;
        while (done < part.length) done += fs.writeSync(fd, part, done, part.length - done);
      }
      fs.fsyncSync(fd);
    } finally {
      fs.closeSync(fd);
    }
    fs.renameSync(tmp, file);
    fsyncDir(path.dirname(file));
  } catch (e) {
    fs.rmSync(tmp, { force: true });
    throw asDiskFull(e, file);
  }
}

/**
 * Writes `text` to `file` only if no file is there: complete (temp file, fsync, then a hard link,
 * which fails when `file` exists) or not at all. False when `file` already existed: its content is
 * left as it was. Writers racing for one name (two producers) get it once.
 */
export function writeFileExclusive(file: string, text: string): boolean {
  const tmp = tempSibling(file, 'tmp');
  try {
    fs.writeFileSync(tmp, text);
    const fd = fs.openSync(tmp, 'r');
    try {
      fs.fsyncSync(fd);
    } finally {
      fs.closeSync(fd);
    }
    fs.linkSync(tmp, file);
  } catch (e) {
    if ((e as NodeJS.ErrnoException).code === 'EEXIST') return false;
    throw asDiskFull(e, file);
  } finally {
    fs.rmSync(tmp, { force: true });
  }
  fsyncDir(path.dirname(file));
  return true;
}

/**
 * Builds a folder with `fill(tmpDir)` in a temp sibling, then moves it to `dir`. An existing `dir`
 * is first renamed aside and deleted only after the new folder is in place, so a crash leaves
 * either the old folder, the new one, or the old one under a `.old-*` name, never a mix.
 * Node has no atomic directory exchange (renameat2), hence the short window without `dir`.
 */
export function writeDirAtomic(dir: string, fill: (tmpDir: string) => void): void {
  const tmp = makeTempDir(dir);
  try {
    fill(tmp);
  } catch (e) {
    fs.rmSync(tmp, { recursive: true, force: true });
    throw asDiskFull(e, dir);
  }
  commitDir(tmp, dir);
}

/** `writeDirAtomic` for a fill that is asynchronous (e.g. the native engine saving a checkpoint). */
export async function writeDirAtomicAsync(dir: string, fill: (tmpDir: string) => Promise<void>): Promise<void> {
  const tmp = makeTempDir(dir);
  try {
    await fill(tmp);
  } catch (e) {
    fs.rmSync(tmp, { recursive: true, force: true });
    throw asDiskFull(e, dir);
  }
  commitDir(tmp, dir);
}

function makeTempDir(dir: string): string {
  try {
    fs.mkdirSync(path.dirname(path.resolve(dir)), { recursive: true });
    sweepDeadSiblings(dir);
    const tmp = tempSibling(dir, 'tmp');
    fs.mkdirSync(tmp);
    return tmp;
  } catch (e) {
    throw asDiskFull(e, dir);
  }
}

function commitDir(tmp: string, dir: string): void {
  let old: string | undefined;
  if (fs.existsSync(dir)) {
    old = tempSibling(dir, 'old');
    fs.renameSync(dir, old);
  }
  fs.renameSync(tmp, dir);
  fsyncDir(path.dirname(path.resolve(dir)));
  if (old) fs.rmSync(old, { recursive: true, force: true });
}

/**
 * The result an earlier call stored as JSON at `file`, or undefined when there is none yet. One that
 * does not parse (a disk that lost its end, an edit by hand) is a `RunFolderDamagedError`: every
 * retry would read the same bytes.
 */
export function storedResult<T>(file: string): T | undefined {
  if (!fs.existsSync(file)) return undefined;
  const text = fs.readFileSync(file, 'utf8');
  try {
    return JSON.parse(text) as T;
  } catch (e) {
    throw new RunFolderDamagedError(file, `not JSON (${(e as Error).message})`);
  }
}

/**
 * What an earlier call stored as JSON at `file`, or else `compute()`'s result, stored there
 * atomically: the idempotence of an activity whose result is its own record. A stored result that
 * is damaged is computed again (that is what the record stands for) and replaced. (An activity
 * whose result comes with a folder writes it last into that folder, committed by `writeDirAtomic`,
 * and reads it back with `storedResult`.)
 */
export async function storedJson<T>(file: string, compute: () => Promise<T>): Promise<T> {
  let done: T | undefined;
  try {
    done = storedResult<T>(file);
  } catch (e) {
    if (!(e instanceof RunFolderDamagedError)) throw e;
  }
  if (done !== undefined) return done;
  const value = await compute();
  try {
    fs.mkdirSync(path.dirname(file), { recursive: true });
  } catch (e) {
    throw asDiskFull(e, file);
  }
  writeFileAtomic(file, JSON.stringify(value, null, 1));
  return value;
}
