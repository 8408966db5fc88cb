/**
 * Loading the native addon (`build/native/Release/prime_native.node`), once, on first use. Each
 * module of the facade (model.ts, generator.ts, trainer.ts, dist.ts, process.ts, checks.ts) types
 * the part of the addon it calls; nothing else touches it.
 */
import * as fs from 'fs';
import * as path from 'path';
import { chooseOpenBlasCore } from './blas-core';

/** The repository root: the nearest directory above this file holding package.json. */
function repoRoot(): string {
  let dir = __dirname;
  while (!fs.existsSync(path.join(dir, 'package.json'))) {
    const up = path.dirname(dir);
    if (up === dir) throw new Error(`prime_native: no package.json above ${__dirname}`);
    dir = up;
  }
  return dir;
}

let addon: unknown;

/** The addon's exports, loaded on first call (untyped here: `A` is the part the caller uses). */
export function loadAddon<A>(): A {
  if (!addon) {
    // PRIME_NATIVE_ADDON: another build of the addon (e.g. the CUDA build, or a baseline to compare with).
    const file =
      process.env.PRIME_NATIVE_ADDON || path.join(repoRoot(), 'build', 'native', 'Release', 'prime_native.node');
    if (!fs.existsSync(file)) throw new Error(`prime_native: ${file} not found; run \`npm run build:native\``);
    chooseOpenBlasCore(); // before OpenBLAS loads with the addon: it picks its kernels then (blas-core.ts)
    addon = require(file);
  }
  return addon as A;
}
