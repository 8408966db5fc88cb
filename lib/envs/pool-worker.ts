/**
 * Entry point of an env worker process (forked by pool.ts through lib/helper-pool.ts). It runs one
 * call at a time: the pool sends the next call only after the reply, so killing a hung worker never
 * loses other calls.
 */
import { serveTasks } from '../helper-pool';
import { loadEnvironment, type EnvSpec } from './loader';
import type { EnvCall, EnvTask } from './pool-protocol';
import type { Environment, EnvironmentInfo } from './types';

const envs = new Map<string, Environment>();

function environment(spec: EnvSpec): Environment {
  const key = JSON.stringify([spec.id, spec.args ?? {}]);
  let env = envs.get(key);
  if (!env) {
    env = loadEnvironment(spec.id, spec.args);
    envs.set(key, env);
  }
  return env;
}

async function run(env: Environment, call: EnvCall): Promise<unknown> {
  switch (call.op) {
    case 'info': {
      const info: EnvironmentInfo = {
        name: env.name,
        maxTurns: env.maxTurns,
        tools: env.tools,
        size: { train: env.dataset.size('train') ?? null, eval: env.dataset.size('eval') ?? null },
      };
      return info;
    }
    case 'example':
      return env.dataset.example(call.split, call.index, call.seed);
    case 'init':
      return env.init(call.example);
    case 'respond':
      return env.respond(call.ctx);
    case 'score':
      return env.score(call.ctx);
  }
}

// A rejection nobody awaits (env code firing and forgetting) must not kill the worker mid-call of
// another rollout; log it for the env's author instead.
process.on('unhandledRejection', (reason) => {
  console.error('env worker: unhandled rejection:', reason);
});

serveTasks(({ env, call }: EnvTask) => run(environment(env), call));
