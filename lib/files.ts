/**
 * Reading a small file someone else named (a config file, a model folder's JSON or template) with
 * a bound: a device (`/dev/zero`), a FIFO or a file larger than the bound is refused before any of
 * it is read, so a wrong path costs an error message, never gigabytes of memory or a hang.
 */
import * as fs from 'node:fs';

/** A file that is not a regular file, or is larger than the caller's bound. */
export class FileRefused extends Error {
  override readonly name = 'FileRefused';
}

/** `n` bytes as people read them (1.5 MiB, 2.1 TiB). */
export function formatBytes(n: number): string {
  const units = ['bytes', 'KiB', 'MiB', 'GiB', 'TiB', 'PiB', 'EiB'];
  let i = 0;
  let v = n;
  while (v >= 1024 && i < units.length - 1) {
    v /= 1024;
    i++;
  }
  return i === 0 ? `${n} bytes` : `${Number.isInteger(v) || v >= 100 ? v.toFixed(0) : v.toFixed(1)} ${units[i]}`;
}

/**
 * The text of `file`, a regular file of at most `maxBytes`. The check is made on the opened file
 * (no window between a check and the read); the file is opened non-blocking, so a FIFO is refused
 * instead of waiting for a writer. A file that grows while it is read is refused too.
 * Errors of the file system itself (ENOENT, EACCES) are thrown as they are.
 */
export function readBoundedText(file: string, maxBytes: number): string {
  const fd = fs.openSync(file, fs.constants.O_RDONLY | fs.constants.O_NONBLOCK);
  try {
    const st = fs.fstatSync(fd);
    if (!st.isFile()) throw new FileRefused(`${file} is not a regular file (${kindOf(st)})`);
    if (st.size > maxBytes)
      throw new FileRefused(`${file} is ${formatBytes(st.size)}, more than the ${formatBytes(maxBytes)} allowed`);
    // One byte more than its size: a file that grows while it is read is caught, not cut short.
    const buf = Buffer.allocUnsafe(st.size + 1);
    let n = 0;
    for (let got; n < buf.length && (got = fs.readSync(fd, buf, n, buf.length - n, null)) > 0;) n += got;
    if (n > st.size) throw new FileRefused(`${file} grew while it was read`);
    return buf.toString('utf8', 0, n);
  } finally {
    fs.closeSync(fd);
  }
}

function kindOf(st: fs.Stats): string {
  if (st.isDirectory()) return 'a folder';
  if (st.isCharacterDevice()) return 'a character device';
  if (st.isBlockDevice()) return 'a block device';
  if (st.isFIFO()) return 'a FIFO';
  if (st.isSocket()) return 'a socket';
  return 'not a file';
}
