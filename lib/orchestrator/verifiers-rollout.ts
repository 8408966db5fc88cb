/**
 * One rollout of a verifiers environment (`[[env]] id = "verifiers:<module>"`): the task is shipped
 * to the env's server (lib/envs/verifiers/server.ts), which calls our inference server itself
 * (`/inference/v1/generate`, rendered and tokenized by its `renderers` client), scores the episode
 * and streams it back. Each trace is a message graph whose nodes carry the tokens they add to the
 * sequence, a mask (true on sampled tokens) and one logprob per sampled token; every root-to-leaf
 * path is one training sample, its tokens exactly as the server generated them (never re-tokenised).
 *
 * Each sampled token's policy version: the step's, in strict mode (the servers serve that one
 * version); in in-flight mode the weights change while a rollout runs, and the server that sampled
 * it keeps the versions of each answer by rollout (lib/inference/server/session-versions.ts), which
 * this side takes once the episode is over and lays onto the sampled tokens.
 */
import type { EnvPool } from '../envs/pool';
import { failedHow, type Message } from '../envs/types';
import type { Tokenizer } from '../model/tokenizer';
import type { InferenceClient } from './client';
import { VerifiersRunError, type VerifiersServers, type WireEpisode, type WireTrace } from '../envs/verifiers/server';
import { isVerifiersEnv } from '../config/names';
import { launchKey, verifiersArgs, verifiersLaunch } from '../envs/verifiers/environment';
import { RECORD_VERSIONS_HEADER } from '../inference/server/session-versions';
import { textOf } from '../json';
import type { TokenSegment } from '../runfolder/packing';
import type { Rollout } from '../runfolder/rollouts';
import { runRollout, type RolloutTask } from './token-rollout';

/** Where the env server reaches the policy. */
export interface VerifiersEndpoint {
  /** An inference server's OpenAI base URL (`http://host:port/v1`). */
  baseUrl: string;
  /** The model as the env server names it (lib/hub.ts verifiersModelName): its requests' model, what its renderer loads (offline). */
  model: string;
  /** The renderer it renders with (verifiers TrainClientConfig.renderer); unset = resolved from the model's name. */
  renderer?: Record<string, unknown>;
  /** Environment variable with the server's API key, if it has one. */
  apiKeyVar?: string;
  /** The policy version the servers were set to serve for these rollouts. */
  policyVersion: number;
  /** Weights change while rollouts run (in-flight mode): take each token's version from the server's records. */
  recordVersions?: boolean;
}

/** One answer's sampled tokens and the version that sampled each, as the server recorded them. */
interface VersionRecord {
  token_ids: number[];
  policy_versions: number[];
}

type Node = {
  parent?: number | null;
  sampled?: boolean;
  message?: { role?: string; content?: unknown };
  token_ids?: number[];
  mask?: boolean[];
  logprobs?: number[];
};

/** Thrown for a trace whose tokens, mask and logprobs do not line up: the rollout errors. */
class MalformedTrace extends Error {}

/** The sampled tokens of a node (its mask). */
const sampledIds = (n: Node): number[] => (n.token_ids ?? []).filter((_, k) => n.mask?.[k]);

/**
 * Each sampled node's token versions from the server's records of the trace's requests (in the
 * order they were answered): a node's sampled tokens are its answer's tokens, in node order; an
 * answer no node kept (a retried turn) is passed over. A node with no record errors the rollout.
 */
export function nodeVersions(trace: WireTrace, records: readonly VersionRecord[]): Map<number, number[]> {
  const out = new Map<number, number[]>();
  let next = 0;
  (trace.nodes as Node[]).forEach((n, i) => {
    const ids = sampledIds(n);
    if (ids.length === 0) return;
    for (; next < records.length; next++) {
      const r = records[next];
      if (r.token_ids.length >= ids.length && ids.every((t, k) => r.token_ids[k] === t)) {
        out.set(i, r.policy_versions.slice(0, ids.length));
        next++;
        return;
      }
    }
    throw new MalformedTrace(
      `trace ${trace.id} node ${i}: the inference server kept no record of its ${ids.length} sampled tokens (restarted mid-rollout?), so their policy version is unknown`,
    );
  });
  return out;
}

/**
 * The training samples of a trace: one per root-to-leaf path with a sampled token; `versions`, each
 * sampled node's token versions, when known.
 */
export function traceSamples(trace: WireTrace, versions?: ReadonlyMap<number, number[]>): TokenSegment[][] {
  const nodes = trace.nodes as Node[];
  nodes.forEach((n, i) => {
    const ids = n.token_ids ?? [];
    const mask = n.mask ?? [];
    const sampled = mask.filter(Boolean).length;
    if (mask.length !== ids.length)
      throw new MalformedTrace(`trace ${trace.id} node ${i}: ${mask.length} mask entries for ${ids.length} tokens`);
    if ((n.logprobs ?? []).length !== sampled)
      throw new MalformedTrace(
        `trace ${trace.id} node ${i}: ${(n.logprobs ?? []).length} logprobs for ${sampled} sampled tokens`,
      );
    if (!(n.logprobs ?? []).every(Number.isFinite))
      throw new MalformedTrace(`trace ${trace.id} node ${i}: a logprob is not a finite number`);
  });
  const hasChild = new Set(nodes.map((n) => n.parent).filter((p) => p !== null && p !== undefined));
  const samples: TokenSegment[][] = [];
  for (let leaf = 0; leaf < nodes.length; leaf++) {
    if (hasChild.has(leaf)) continue;
    const path: Node[] = [];
    for (let at: number | null | undefined = leaf; at !== null && at !== undefined; at = nodes[at].parent) {
      if (path.length > nodes.length) throw new MalformedTrace(`trace ${trace.id}: a cycle in node parents`);
      path.push(nodes[at]);
    }
    path.reverse();
    const segments: TokenSegment[] = [];
    for (const n of path) {
      const ids = n.token_ids ?? [];
      const mask = n.mask ?? [];
      const logprobs = n.logprobs ?? [];
      const nodeVersionList = versions?.get(nodes.indexOf(n));
      let lp = 0;
      for (let start = 0; start < ids.length;) {
        let end = start;
        while (end < ids.length && mask[end] === mask[start]) end++;
        const generated = mask[start];
        const tokens = ids.slice(start, end);
        const last = segments[segments.length - 1];
        // Runs of one kind join across nodes (a prompt's messages, the generation prompt): one segment each.
        const lps = generated ? logprobs.slice(lp, lp + tokens.length) : undefined;
        const vs = generated && nodeVersionList ? nodeVersionList.slice(lp, lp + tokens.length) : undefined;
        // The message a run of tokens the model did not sample belongs to (echo trains them by role).
        const span = { role: n.message?.role ?? 'unknown', tokens: tokens.length };
        if (last && last.generated === generated) {
          last.tokens = [...(last.tokens as number[]), ...tokens];
          if (lps) last.logprobs = [...(last.logprobs as number[]), ...lps];
          if (vs) last.versions = [...((last.versions as number[] | undefined) ?? []), ...vs];
          if (!generated) last.roles = [...(last.roles ?? []), span];
        } else
          segments.push(
            generated
              ? { tokens, generated, logprobs: lps, ...(vs ? { versions: vs } : {}) }
              : { tokens, generated, roles: [span] },
          );
        if (generated) lp += tokens.length;
        start = end;
      }
    }
    if (segments.some((s) => s.generated)) samples.push(segments);
  }
  return samples;
}

const score = (r: unknown): number | undefined => {
  const v = r as { score?: number; weight?: number } | null;
  return v && typeof v.score === 'number' ? v.score * (v.weight ?? 1) : undefined;
};

function errorText(errors: unknown): string | undefined {
  const list = Array.isArray(errors) ? (errors as { type?: string; message?: string }[]) : [];
  const last = list[list.length - 1];
  return last ? `${last.type ?? 'Error'}: ${last.message ?? JSON.stringify(last)}` : undefined;
}

function text(content: unknown): string {
  if (typeof content === 'string') return content;
  if (Array.isArray(content)) return content.map((p) => (p as { text?: string }).text ?? '').join('');
  return '';
}

/** A rollout with nothing to train, at `policyVersion` (the version the servers were set to); `error` set when it failed. */
function emptyRollout(policyVersion: number, error?: string): Rollout {
  return {
    completion: [],
    reward: 0,
    metrics: {},
    turns: 0,
    samples: [],
    completionTokens: 0,
    truncated: false,
    policyVersion,
    newestPolicyVersion: policyVersion,
    ...(error === undefined ? {} : { error }),
  };
}

/**
 * An assembled episode as our Rollout: samples, reward (mean over its traces), metrics, errors.
 * `records`, by trace id: the server's records of each trace's answers (in-flight mode), which
 * give the tokens their versions and the rollout its oldest and newest.
 */
export function episodeRollout(
  episode: WireEpisode,
  policyVersion: number,
  records?: ReadonlyMap<string, VersionRecord[]>,
): Rollout {
  const traces = episode.traces;
  const failed =
    errorText(episode.errors) ??
    traces
      .map((t) => (t.ok === false ? (errorText(t.errors) ?? `trace ${t.id} did not complete`) : undefined))
      .find(Boolean);
  if (failed) return emptyRollout(policyVersion, `verifiers: ${failed}`);
  if (traces.length === 0) return emptyRollout(policyVersion, 'verifiers: the episode has no trace');
  let perTrace: TokenSegment[][][];
  try {
    perTrace = traces.map((t) => traceSamples(t, records ? nodeVersions(t, records.get(t.id) ?? []) : undefined));
  } catch (e) {
    if (e instanceof MalformedTrace) return emptyRollout(policyVersion, `verifiers: ${e.message}`);
    throw e;
  }
  const samples = perTrace.flat();
  const metrics: Record<string, number> = {};
  let reward = 0;
  const traceRewards: number[] = [];
  for (const t of traces) {
    const rewards = (t.rewards ?? {}) as Record<string, unknown>;
    let own = 0;
    for (const [name, r] of Object.entries(rewards)) {
      const v = score(r);
      if (v === undefined) continue;
      own += v;
      reward += v / traces.length;
      metrics[name] = (metrics[name] ?? 0) + (r as { score: number }).score / traces.length;
    }
    for (const [name, v] of Object.entries((t.metrics ?? {}) as Record<string, number | null>))
      if (typeof v === 'number') metrics[name] = (metrics[name] ?? 0) + v / traces.length;
    traceRewards.push(own);
  }
  const nodes = traces.flatMap((t) => t.nodes as Node[]);
  const firstSampled = nodes.findIndex((n) => n.sampled);
  const completion = (firstSampled < 0 ? [] : nodes.slice(firstSampled)).map(
    (n) => ({ role: n.message?.role ?? 'assistant', content: text(n.message?.content) }) as Message,
  );
  const stop = traces.map((t) => textOf(t.stop_condition ?? '')).join(' ');
  const versions = samples.flatMap((s) => s.flatMap((g) => Array.from(g.versions ?? [])));
  return {
    ...emptyRollout(policyVersion),
    ...(versions.length > 0
      ? { policyVersion: Math.min(...versions), newestPolicyVersion: Math.max(...versions) }
      : {}),
    completion,
    reward,
    metrics,
    turns: nodes.filter((n) => n.sampled).length,
    samples,
    completionTokens: samples.reduce(
      (a, s) => a + s.filter((g) => g.generated).reduce((b, g) => b + g.tokens.length, 0),
      0,
    ),
    truncated: /length|context|overlong/i.test(stop),
    // Several agents' traces: each its own reward (the sum of its weighted rewards, verifiers' trace.reward).
    ...(traces.length > 1
      ? {
          traces: traces.map((t, i) => ({
            agent: textOf((t.agent as { name?: unknown } | undefined)?.name ?? `agent${i}`),
            reward: traceRewards[i],
            samples: perTrace[i].length,
          })),
        }
      : {}),
  };
}

/** The server's records of each trace's answers, taken (POST /inference/v1/session_versions). */
async function takeVersions(
  endpoint: VerifiersEndpoint,
  traces: readonly WireTrace[],
): Promise<Map<string, VersionRecord[]>> {
  const root = endpoint.baseUrl.replace(/\/v1\/?$/, '');
  const key = endpoint.apiKeyVar ? process.env[endpoint.apiKeyVar] : undefined;
  const out = new Map<string, VersionRecord[]>();
  for (const t of traces) {
    let res: Response;
    try {
      res = await fetch(`${root}/inference/v1/session_versions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', ...(key ? { authorization: `Bearer ${key}` } : {}) },
        body: JSON.stringify({ session_id: t.id }),
        signal: AbortSignal.timeout(60_000),
      });
    } catch (e) {
      throw new VerifiersRunError(`the policy versions of trace ${t.id}: ${(e as Error).message}`, 'error');
    }
    if (!res.ok)
      throw new VerifiersRunError(
        `the policy versions of trace ${t.id}: HTTP ${res.status} ${await res.text()}`,
        'error',
      );
    out.set(t.id, ((await res.json()) as { records: VersionRecord[] }).records);
  }
  return out;
}

/** Plays `task` (an example of a verifiers env) on its env server; failures of the server error this rollout only. */
export async function runVerifiersRollout(
  task: RolloutTask,
  servers: VerifiersServers,
  endpoint: VerifiersEndpoint,
): Promise<Rollout> {
  const args = verifiersArgs.parse(task.env.args ?? {});
  const { sampling } = task;
  try {
    const launch = verifiersLaunch(task.env.id, args);
    const episode = await servers.run({
      key: JSON.stringify([launchKey(launch), args.max_concurrent ?? null]),
      name: task.env.id,
      launch,
      maxConcurrent: args.max_concurrent,
      startTimeoutMs: args.start_timeout_s * 1000,
      timeoutMs: args.timeout_s * 1000,
      task_data: task.example.info.task_data as Record<string, unknown>,
      client: {
        type: 'train',
        base_url: endpoint.baseUrl,
        // verifiers reads the key from this variable; unset = no key ("EMPTY").
        api_key_var: endpoint.apiKeyVar ?? 'PRIME_RL_NO_API_KEY',
        renderer_model_name: endpoint.model,
        ...(endpoint.renderer ? { renderer: endpoint.renderer } : {}),
        // Our server then keeps each answer's token versions under the rollout's X-Session-ID.
        ...(endpoint.recordVersions ? { headers: { [RECORD_VERSIONS_HEADER]: '1' } } : {}),
      },
      model: endpoint.model,
      sampling: {
        temperature: sampling.temperature,
        top_p: sampling.top_p,
        top_k: sampling.top_k,
        min_p: sampling.min_p,
        seed: task.seed,
        ...(sampling.max_tokens !== undefined ? { max_tokens: sampling.max_tokens } : {}),
        ...(sampling.stop?.length ? { stop: sampling.stop } : {}),
      },
    });
    const records = endpoint.recordVersions ? await takeVersions(endpoint, episode.traces) : undefined;
    return episodeRollout(episode, endpoint.policyVersion, records);
  } catch (e) {
    if (!(e instanceof VerifiersRunError)) throw e;
    return emptyRollout(endpoint.policyVersion, `verifiers env server ${failedHow(e.kind)}: ${e.message}`);
  }
}

/** A rollout of any env: a verifiers env on its env server, any other through the env pool (token-rollout.ts). */
export function playRollout(
  task: RolloutTask,
  pool: EnvPool,
  client: InferenceClient,
  tokenizer: Tokenizer,
  endpoint: VerifiersEndpoint,
): Promise<Rollout> {
  return isVerifiersEnv(task.env.id)
    ? runVerifiersRollout(task, pool.verifiers, endpoint)
    : runRollout(task, pool, client, tokenizer);
}
