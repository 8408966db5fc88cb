/**
 * `output_dir` is checked when the config is read, not when the first file is written: a path that
 * can never hold run folders (`/dev/null`, a file, a name too long for the file system) is a config
 * error naming the key (exit 2), instead of a stack trace after the launcher has started.
 */
import * as fs from 'node:fs';
import * as path from 'node:path';

/** Longest file name most file systems take (ext4, xfs, btrfs: 255 bytes). */
export const NAME_MAX_BYTES = 255;

/**
 * Longest run name: it is a folder name of output_dir, and atomic writes make siblings of it named
 * `<run>.tmp-<host>-<pid>-<8 hex>` (lib/atomic.ts), so it leaves room for a host name of 64 bytes.
 */
export const RUN_NAME_MAX = 128;

/** Why `dir` cannot be (or become) a folder of run folders; undefined when it can. */
export function outputDirProblem(dir: string): string | undefined {
  const full = path.resolve(dir);
  const long = full.split(path.sep).find((part) => Buffer.byteLength(part) > NAME_MAX_BYTES);
  if (long !== undefined)
    return `the name ${long.slice(0, 32)}... is ${Buffer.byteLength(long)} bytes, more than the ${NAME_MAX_BYTES} a file name may have`;
  // The nearest part of the path that exists must be a folder we may create folders in.
  for (let at = full; ; at = path.dirname(at)) {
    let st: fs.Stats;
    try {
      st = fs.statSync(at);
    } catch (e) {
      const code = (e as NodeJS.ErrnoException).code;
      if (code === 'ENOENT' && path.dirname(at) !== at) continue;
      if (code === 'ENOTDIR') continue; // a file further up: reported when the walk reaches it
      return `${at} cannot be read (${code ?? (e as Error).message})`;
    }
    if (!st.isDirectory())
      return at === full ? `${full} exists and is not a folder` : `${at} is not a folder, so ${full} cannot be made`;
    try {
      fs.accessSync(at, fs.constants.W_OK | fs.constants.X_OK);
    } catch {
      return at === full ? `${full} is not writable` : `${full} cannot be made: ${at} is not writable`;
    }
    return undefined;
  }
}
