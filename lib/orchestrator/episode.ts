/**
 * The one episode driver: an environment's example played turn by turn against a policy, then
 * scored by the environment's rubric. Token rollouts (RL and local eval, token-rollout.ts) and chat
 * rollouts (an external API, chat-rollout.ts) differ only in their `Player`: how a turn is sampled
 * and what the environment's reply does to the policy's context.
 */
import type { EnvPool, EnvCallResult } from '../envs/pool';
import type { EnvSpec } from '../envs/loader';
import { failedHow, type EnvironmentInfo, type Example, type JsonObject, type Message } from '../envs/types';
import type { Episode } from '../runfolder/rollouts';
import { InferenceError } from './client';

/** A failure of this episode only (an environment error, an aborted request): it errors the episode. */
export class EpisodeError extends Error {}

export interface EpisodeTask {
  env: EnvSpec;
  info: EnvironmentInfo;
  example: Example;
}

/** The policy's side of an episode. */
export interface Player {
  /**
   * The assistant's reply at turn `turn` (from 1) to `messages`, the conversation so far; `last`
   * when no further turn fits in the context. Undefined when not even this turn fits.
   */
  act(messages: readonly Message[], turn: number): Promise<{ reply: Message; last?: boolean } | undefined>;
  /** The environment's reply was appended to `messages`: the context of the next `act`. */
  observe?(messages: readonly Message[]): void;
}

function unwrap<T>(r: EnvCallResult<T>, what: string): T {
  if (r.ok) return r.value;
  throw new EpisodeError(`environment ${what} ${failedHow(r.kind)}: ${r.error}`);
}

/**
 * Plays `task` with `player` until the environment ends it, `info.maxTurns` is reached or the
 * context is full, then scores it. The episode's own failures (EpisodeError, a request the server
 * rejects as invalid) error this episode only; anything else (an unreachable or failing server, a
 * server refusing the run: client.ts) is thrown, to fail or retry the activity.
 */
export async function playEpisode(
  { env, info, example }: EpisodeTask,
  pool: EnvPool,
  player: Player,
): Promise<Episode> {
  const messages: Message[] = [...example.prompt];
  const episode: Episode = { completion: [], reward: 0, metrics: {}, turns: 0 };
  try {
    let state = unwrap(await pool.init(env, example), 'init') as JsonObject;
    for (let turn = 1; ; turn++) {
      const acted = await player.act(messages, turn);
      if (!acted) break;
      messages.push(acted.reply);
      episode.completion.push(acted.reply);
      episode.turns = turn;
      if (acted.last || turn >= info.maxTurns) break;
      const response = unwrap(await pool.respond(env, { example, messages, state, turn }), 'respond');
      if (response.state) state = response.state as JsonObject;
      if (response.done) break;
      const added = response.messages ?? [];
      if (added.length === 0)
        throw new EpisodeError(`environment ${env.id} neither ended the rollout nor replied at turn ${turn}`);
      messages.push(...added);
      episode.completion.push(...added);
      player.observe?.(messages);
    }
    const score = unwrap(await pool.score(env, { example, messages, completion: episode.completion, state }), 'score');
    episode.reward = score.reward;
    episode.metrics = score.metrics;
  } catch (e) {
    const own = e instanceof EpisodeError || (e instanceof InferenceError && e.rejectsRequest);
    if (!own) throw e;
    episode.error = (e as Error).message;
  }
  return episode;
}
