/**
 * Entry point of an env worker process (forked by pool.ts). It runs one call at a time: the pool
 * sends the next call only after the reply, so killing a hung worker never loses other calls.
 */
import { loadEnvironment, type EnvSpec } from './loader';
import type { EnvCall, PoolRequest, WorkerMessage } from './pool-protocol';
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

function send(message: WorkerMessage): void {
  process.send!(message);
}

process.on('message', async (req: PoolRequest) => {
  try {
    const value = await run(environment(req.env), req.call);
    send({ type: 'result', id: req.id, ok: true, value });
  } catch (err) {
    const e = err instanceof Error ? err : new Error(String(err));
    send({ type: 'result', id: req.id, ok: false, error: e.message, stack: e.stack });
  }
});

// A rejection nobody awaits (env code firing and forgetting) must not kill the worker mid-call of
// another rollout; log it for the env's author instead.
process.on('unhandledRejection', (reason) => {
  console.error('env worker: unhandled rejection:', reason);
});

// The orchestrator died or closed the pool: do not linger as an orphan.
process.on('disconnect', () => process.exit(0));

send({ type: 'ready' });
