/**
 * Finds environments by id: a built-in name, `verifiers:<module>` (verifiers/environment.ts), a module path (`./my_env.ts`, `/abs/env.js`; relative
 * to the working directory), or an installed npm package (lib/modules.ts). A module's default export or its
 * `environment` export must be an environment definition (see `defineEnvironment`).
 */
import { requireUserModule } from '../modules';
import { BUILTIN_ENVIRONMENTS } from './builtin';
import { instantiate, isEnvironmentDefinition, type EnvironmentDefinition } from './define';
import type { Environment } from './types';
import { isVerifiersEnv } from '../config/names';
import { verifiersEnvironment } from './verifiers/environment';

/** One `[[env]]` entry as the pool and the mix see it. */
export interface EnvSpec {
  id: string;
  args?: Record<string, unknown>;
}

export const BUILTIN_ENV_IDS: readonly string[] = Object.keys(BUILTIN_ENVIRONMENTS);

function requireModule(id: string): unknown {
  return requireUserModule(id, (what, isPath) =>
    isPath
      ? new Error(`environment "${id}": module ${what} not found`)
      : new Error(
          `unknown environment "${id}": not a built-in (${BUILTIN_ENV_IDS.join(', ')}), a module path (./file.ts) or an installed npm package`,
        ),
  );
}

/** The definition behind an id (built-ins first). */
export function resolveEnvironment(id: string): EnvironmentDefinition {
  if (isVerifiersEnv(id)) return verifiersEnvironment(id) as unknown as EnvironmentDefinition;
  const builtin = BUILTIN_ENVIRONMENTS[id];
  if (builtin) return builtin;
  const mod = requireModule(id) as Record<string, unknown> | undefined;
  const def = [mod?.default, mod?.environment, mod].find(isEnvironmentDefinition);
  if (!def) {
    throw new Error(
      `environment "${id}": the module exports no environment definition (a default or \`environment\` export made with defineEnvironment)`,
    );
  }
  return def;
}

/** Resolves `id`, validates `args` with the env's schema and builds it. Errors name the id. */
export function loadEnvironment(id: string, args: Record<string, unknown> = {}): Environment {
  return instantiate(resolveEnvironment(id), args, id);
}
