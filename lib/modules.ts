/**
 * Loading user code by id, the one way environments and algorithm plugins (advantage estimators,
 * rollout filters) are found: a module path (`./my.ts`, `../x.js`, `/abs/y.ts`; relative to the
 * working directory) or an installed npm package. TypeScript files load through register-ts when
 * prime-rl itself runs compiled (under jest, .ts loads already).
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import { projectRoot } from './paths';

const REGISTER_TS = path.join(projectRoot, 'lib', 'envs', 'register-ts.js');

/** `./x`, `../x`, absolute paths, and `x.ts`/`x.js` files that exist (else `chart.js` is a package). */
export function isModulePath(id: string): boolean {
  if (id.startsWith('./') || id.startsWith('../') || path.isAbsolute(id)) return true;
  return /\.(c|m)?[jt]s$/.test(id) && fs.existsSync(path.resolve(process.cwd(), id));
}

function isNotFound(err: unknown, request: string): boolean {
  const e = err as NodeJS.ErrnoException;
  // Only "this very module is missing"; a missing import *inside* the module must surface as is.
  return e?.code === 'MODULE_NOT_FOUND' && e.message.includes(`'${request}'`);
}

/**
 * The exports of module `id`. When it does not exist, throws `notFound(what)`: `what` is the
 * resolved file of a module path, or `id` itself for a package. Errors inside the module surface as is.
 */
export function requireUserModule(id: string, notFound: (what: string, isPath: boolean) => Error): unknown {
  if (isModulePath(id)) {
    const file = path.resolve(process.cwd(), id);
    if (file.endsWith('.ts') && !__filename.endsWith('.ts')) require(REGISTER_TS);
    try {
      return require(file);
    } catch (err) {
      if (isNotFound(err, file)) throw notFound(file, true);
      throw err;
    }
  }
  let resolved: string;
  try {
    resolved = require.resolve(id, { paths: [process.cwd()] });
  } catch (err) {
    if (isNotFound(err, id)) throw notFound(id, false);
    throw err;
  }
  return require(resolved);
}
