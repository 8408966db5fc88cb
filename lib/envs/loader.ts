/**
 * Finds environments by id: a built-in name, a module path (`./my_env.ts`, `/abs/env.js`; relative
 * to the working directory), or an installed npm package. A module's default export or its
 * `environment` export must be an environment definition (see `defineEnvironment`).
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import { projectRoot } from '../paths';
import { BUILTIN_ENVIRONMENTS } from './builtin';
import { instantiate, isEnvironmentDefinition, type EnvironmentDefinition } from './define';
import type { Environment } from './types';

/** One `[[env]]` entry as the pool and the mix see it. */
export interface EnvSpec {
  id: string;
  args?: Record<string, unknown>;
}

export const BUILTIN_ENV_IDS: readonly string[] = Object.keys(BUILTIN_ENVIRONMENTS);

const REGISTER_TS = path.join(projectRoot, 'lib', 'envs', 'register-ts.js');

/** `./x`, `../x`, absolute paths, and `x.ts`/`x.js` files that exist (else `chart.js` is a package). */
function isModulePath(id: string): boolean {
  if (id.startsWith('./') || id.startsWith('../') || path.isAbsolute(id)) return true;
  return /\.(c|m)?[jt]s$/.test(id) && fs.existsSync(path.resolve(process.cwd(), id));
}

function isNotFound(err: unknown, request: string): boolean {
  const e = err as NodeJS.ErrnoException;
  // Only "this very module is missing"; a missing import *inside* the module must surface as is.
  return e?.code === 'MODULE_NOT_FOUND' && e.message.includes(`'${request}'`);
}

function requireModule(id: string): unknown {
  if (isModulePath(id)) {
    const file = path.resolve(process.cwd(), id);
    // When this file is itself TypeScript, whatever loaded it (jest, the hook) handles .ts already.
    if (file.endsWith('.ts') && !__filename.endsWith('.ts')) require(REGISTER_TS);
    try {
      return require(file);
    } catch (err) {
      if (isNotFound(err, file)) throw new Error(`environment "${id}": module ${file} not found`);
      throw err;
    }
  }
  let resolved: string;
  try {
    resolved = require.resolve(id, { paths: [process.cwd()] });
  } catch (err) {
    if (isNotFound(err, id)) {
      throw new Error(
        `unknown environment "${id}": not a built-in (${BUILTIN_ENV_IDS.join(', ')}), a module path (./file.ts) or an installed npm package`,
      );
    }
    throw err;
  }
  return require(resolved);
}

/** The definition behind an id (built-ins first). */
export function resolveEnvironment(id: string): EnvironmentDefinition {
  const builtin = BUILTIN_ENVIRONMENTS[id];
  if (builtin) return builtin;
  const mod = requireModule(id) as Record<string, unknown> | undefined;
  const def = [mod?.default, mod?.environment, mod].find(isEnvironmentDefinition);
  if (!def) {
    throw new Error(`environment "${id}": the module exports no environment definition (a default or \`environment\` export made with defineEnvironment)`);
  }
  return def;
}

/** Resolves `id`, validates `args` with the env's schema and builds it. Errors name the id. */
export function loadEnvironment(id: string, args: Record<string, unknown> = {}): Environment {
  return instantiate(resolveEnvironment(id), args, id);
}
