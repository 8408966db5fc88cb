/**
 * The orchestrator's side of the inference servers (our own `prime-rl inference`): token-in
 * `/v1/generate` spread over one or more servers, and making every server serve the policy version
 * a step asks for.
 *
 * Several servers (a fleet): each request goes to the live server with the fewest of this client's
 * requests in flight (ties in turn), `maxInFlight` per server at most. A server that answers
 * `unavailable` is set aside at once: the request moves to another server (seeds are per request,
 * so which server answers changes no sample), and the set-aside server gets nothing until a probe
 * (`/health`, first after 1 s, then at doubling intervals up to 30 s while it keeps failing) finds
 * it back and has brought it to the client's policy. An answer from an older policy version than
 * the client's (a server restarted between two requests) sets it aside the same way. Only when no
 * server is left does a request fail, `unavailable`: the activity fails and Temporal retries it.
 *
 * What an answer means for the run (`InferenceError.kind`):
 *  - `request`: a 4xx for one `/v1/generate` request (400 bad request, 413, 422: e.g. a prompt too
 *    long for the context). It errors that one rollout; the step goes on without it.
 *  - `config`: the server refuses the run itself, and retrying cannot change that: 401 (no or a
 *    wrong API key), 403 (e.g. a weight folder outside its allowed roots), 404 (no such route or
 *    model: the base URL is not a prime-rl inference server), or any other 4xx to `/health`,
 *    `/update_weights` or `/reload_weights` (weights it cannot load). Activities fail the run with
 *    it (non-retryable, `Failure.InferenceRejected`).
 *  - `busy`: 429 (queue full) or 503 (shutting down, overloaded). Retried here with backoff,
 *    `busyTimeoutMs` at most, before it counts as `unavailable`.
 *  - `unavailable`: unreachable, timed out, 408 or 5xx, or silent: no answer, not even to
 *    `/health`, for `livenessMs` while requests are in flight (stopped, hung, cut off by the
 *    network; lib/orchestrator/server-watch.ts). The request moves to another server; with none
 *    left, the activity fails and Temporal retries it (same seeds, same requests).
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { Failure, NonRetryableError } from '../failures';
import type { ServerLoad } from '../runfolder/inflight-groups';
import type { EngineReading } from './concurrency';
import { parseServerMetrics } from './server-load';
import { ServerWatch } from './server-watch';

export interface GenerateParams {
  temperature: number;
  top_p: number;
  top_k: number;
  min_p: number;
  max_tokens: number;
  seed: number;
  /** Stop strings (omitted when none). */
  stop?: string[];
  /** MoE router replay: also return the experts each token was routed to (omitted when off). */
  return_routes?: boolean;
}

export interface GenerateResult {
  tokenIds: number[];
  logprobs: number[];
  finishReason: 'stop' | 'length' | 'abort';
  policyVersion: number;
  /** Per token, the policy version that sampled it (a server without them: `policyVersion` for each). */
  tokenPolicyVersions: number[];
  /**
   * With `return_routes`: the experts (sparse layers x experts per token, flattened) of prompt
   * tokens 0..P-2, and of the token fed at each decode step (step 0 feeds the last prompt token,
   * step i the sampled token i - 1).
   */
  promptRoutes?: number[][];
  routes?: number[][];
}

/** Where a policy version's weights live: version 0 is the base model the servers started with. */
export interface PolicyRef {
  version: number;
  /** HF folder of the weights; unused for version 0 (reload_weights). */
  weightDir: string;
}

export type InferenceErrorKind = 'request' | 'config' | 'busy' | 'unavailable';

export class InferenceError extends Error {
  constructor(
    message: string,
    readonly status: number | undefined,
    /** What it means for the run: see the top of this file. */
    readonly kind: InferenceErrorKind,
  ) {
    super(message);
  }

  /** The server answered that this one request is invalid: that fails the one rollout. */
  get rejectsRequest(): boolean {
    return this.kind === 'request';
  }
}

/**
 * What a non-2xx status means: from our own server, for a generation request or a control route; or
 * from an external OpenAI-compatible API (`external`: the eval's chat rollouts), whose statuses name
 * no setting of ours: any 4xx but 429 errors the one rollout (a wrong key errors them all, and the
 * eval fails with it), the rest fails the activity, which Temporal retries.
 */
export function classifyStatus(status: number, route: 'generate' | 'control' | 'external'): InferenceErrorKind {
  if (route === 'external') return status >= 400 && status < 500 && status !== 429 ? 'request' : 'unavailable';
  if (status === 429 || status === 503) return 'busy';
  if (status === 401 || status === 403 || status === 404) return 'config';
  if (status >= 400 && status < 500 && status !== 408) return route === 'generate' ? 'request' : 'config';
  return 'unavailable';
}

/**
 * An error answer as `HTTP <status>: <message>`: the `error.message` of an OpenAI-style body (our
 * server's, lib/inference/server/, and most APIs'), else the raw text, cut to 1000 characters.
 */
export function httpErrorText(status: number, body: string): string {
  let message = body;
  try {
    message = (JSON.parse(body) as { error?: { message?: string } }).error?.message ?? body;
  } catch {
    // not JSON: keep the raw text
  }
  return `HTTP ${status}: ${message.slice(0, 1000)}`;
}

/**
 * Inside an activity: an error that retrying cannot fix becomes a `NonRetryableError` that ends
 * the run with its message; anything else is left to Temporal's retries.
 */
export function toActivityFailure(e: unknown): unknown {
  if (e instanceof InferenceError && e.kind === 'config')
    return new NonRetryableError(e.message, Failure.InferenceRejected);
  return e;
}

export interface InferenceClientOptions {
  /**
   * Environment variable holding the servers' API key, sent as `Authorization: Bearer`. Set but
   * empty in this process: a `config` error at construction.
   */
  apiKeyVar?: string;
  /** The config key that names `apiKeyVar`, for error messages. */
  apiKeySetting?: string;
  /** Most `/v1/generate` requests in flight per server; more wait here for a slot. Unset = no bound. */
  maxInFlight?: number;
  /** Per HTTP request. */
  timeoutMs?: number;
  /**
   * A server that answers nothing (requests nor `/health`) this long while requests to it are in
   * flight is unavailable: its requests move (lib/orchestrator/server-watch.ts). Default 60 s.
   */
  livenessMs?: number;
  /** How long one request keeps retrying a busy server (429/503) before it counts as unavailable. */
  busyTimeoutMs?: number;
}

/** Backoff on a busy server: 100 ms doubling to 5 s, jittered so that waiting requests spread out. */
const BUSY_FIRST_MS = 100;
const BUSY_MAX_MS = 5_000;
/** A load reading waits this long for a server's `/metrics`. */
const LOAD_TIMEOUT_MS = 2_000;
/** Probes of a set-aside server: the first 1 s after it failed, then doubling up to 30 s. */
const PROBE_FIRST_MS = 1_000;
const PROBE_MAX_MS = 30_000;

/** One server as this client sees it. */
interface Server {
  url: string;
  /** The server root: routes outside /v1 hang off it. */
  root: string;
  /** This client's requests in flight there. */
  inFlight: number;
  /** Requests it answered. */
  served: number;
  /** Set aside: no requests until a probe finds it back, at the client's policy. */
  aside: boolean;
  probing: boolean;
  /** When the next probe may start, and the wait after it should that one fail too. */
  probeAt: number;
  probeDelayMs: number;
  /** Why it was last set aside. */
  lastError?: InferenceError;
  /** Its liveness while requests to it are in flight. */
  watch: ServerWatch;
}

/** What `servers()` reports of each server, for logs and tests. */
export interface ServerView {
  url: string;
  inFlight: number;
  served: number;
  aside: boolean;
}

interface Waiter {
  /** The server the request just failed on: taken only when no other server is live. */
  avoid?: number;
  resolve: (server: number) => void;
  reject: (e: unknown) => void;
}

export class InferenceClient {
  private next = 0;
  private readonly apiKey?: string;
  private readonly apiKeyVar?: string;
  private readonly apiKeySetting: string;
  private readonly maxInFlight: number;
  private readonly timeoutMs: number;
  private readonly busyTimeoutMs: number;
  private readonly fleet: Server[];
  /** Requests waiting for a slot, first come first served. */
  private readonly waiters: Waiter[] = [];
  /** The policy of the last `ensurePolicy`: a server coming back is brought to it first. */
  private policy?: PolicyRef;
  /** The first `config` error of a generate request: every later one fails with it at once. */
  private fatal?: InferenceError;

  /** `baseUrls` as in config (`http://host:port/v1`); routes outside /v1 hang off the server root. */
  constructor(baseUrls: readonly string[], opts: InferenceClientOptions = {}) {
    if (baseUrls.length === 0) throw new Error('no inference base URLs configured');
    this.apiKeySetting = opts.apiKeySetting ?? 'inference.server.api_key_var';
    if (opts.apiKeyVar !== undefined) {
      this.apiKeyVar = opts.apiKeyVar;
      this.apiKey = process.env[opts.apiKeyVar];
      if (!this.apiKey) {
        throw new InferenceError(
          `${this.apiKeySetting} names environment variable ${opts.apiKeyVar}, which is not set (or empty) in this worker's environment`,
          undefined,
          'config',
        );
      }
    }
    this.maxInFlight = opts.maxInFlight ?? Infinity;
    this.timeoutMs = opts.timeoutMs ?? 600_000;
    this.busyTimeoutMs = opts.busyTimeoutMs ?? 600_000;
    const livenessMs = opts.livenessMs ?? 60_000;
    this.fleet = baseUrls.map((url) => {
      const root = url.replace(/\/+$/, '').replace(/\/v1$/, '');
      return {
        url,
        root,
        inFlight: 0,
        served: 0,
        aside: false,
        probing: false,
        probeAt: 0,
        probeDelayMs: PROBE_FIRST_MS,
        watch: new ServerWatch(root, livenessMs, () => this.authorization()),
      };
    });
  }

  /** Each server's load and state, in `baseUrls` order. */
  servers(): ServerView[] {
    return this.fleet.map(({ url, inFlight, served, aside }) => ({ url, inFlight, served, aside }));
  }

  /** What to add to a 401's message: which key was sent, or that none was. */
  private keyHint(): string {
    return this.apiKey
      ? `the API key sent (environment variable ${this.apiKeyVar}, named by ${this.apiKeySetting}) is not this server's`
      : `the server wants an API key: set ${this.apiKeySetting} to the environment variable that holds it`;
  }

  private authorization(): { authorization?: string } {
    return this.apiKey ? { authorization: `Bearer ${this.apiKey}` } : {};
  }

  /**
   * The live servers' load, summed (lib/orchestrator/server-load.ts), or undefined when a live
   * server gives none: no answer within LOAD_TIMEOUT_MS, an error status, or no known gauge on its
   * `/metrics`. A reading, not a request: it is not retried and sets no server aside.
   */
  async load(): Promise<ServerLoad | undefined> {
    const readings = await this.readings();
    return readings?.reduce((a, l) => ({ running: a.running + l.running, waiting: a.waiting + l.waiting }), {
      running: 0,
      waiting: 0,
    });
  }

  /**
   * Each live server's counters on its `/metrics` (lib/orchestrator/server-load.ts), or undefined
   * when a server gives none (as `load`).
   */
  async readings(): Promise<EngineReading[] | undefined> {
    const live = this.fleet.filter((s) => !s.aside);
    const readings = await Promise.all(
      live.map(async (s) => {
        try {
          const res = await fetch(`${s.root}/metrics`, {
            headers: this.authorization(),
            signal: AbortSignal.timeout(LOAD_TIMEOUT_MS),
          });
          const counters = res.ok ? parseServerMetrics(await res.text()) : undefined;
          return counters && { id: s.root, ...counters };
        } catch {
          return undefined;
        }
      }),
    );
    const known = readings.filter((l): l is EngineReading => l !== undefined);
    if (live.length === 0 || known.length < live.length) return undefined;
    return known;
  }

  /** One request to `s` (`routePath` off its root), bounded by `timeoutMs` and by the server's liveness. */
  private once<T>(
    s: Server,
    routePath: string,
    route: 'generate' | 'control',
    init?: { body?: unknown; method?: string },
  ): Promise<T> {
    return s.watch.run((silenced) => this.request<T>(s, `${s.root}${routePath}`, route, silenced, init));
  }

  private async request<T>(
    s: Server,
    url: string,
    route: 'generate' | 'control',
    silenced: AbortSignal,
    init?: { body?: unknown; method?: string },
  ): Promise<T> {
    let res: Response;
    try {
      res = await fetch(url, {
        method: init?.method ?? (init?.body === undefined ? 'GET' : 'POST'),
        headers: { 'content-type': 'application/json', ...this.authorization() },
        body: init?.body === undefined ? undefined : JSON.stringify(init.body),
        signal: AbortSignal.any([AbortSignal.timeout(this.timeoutMs), silenced]),
      });
    } catch (e) {
      throw new InferenceError(
        `inference server ${url} unreachable: ${(e as Error).message}`,
        undefined,
        'unavailable',
      );
    }
    s.watch.answered();
    let text: string;
    try {
      text = await res.text();
    } catch (e) {
      // The server died (or went silent, or timed out) while it sent the answer.
      throw new InferenceError(
        `inference server ${url} cut its answer: ${(e as Error).message}`,
        undefined,
        'unavailable',
      );
    }
    if (!res.ok) {
      const kind = classifyStatus(res.status, route);
      const hint = res.status === 401 ? `: ${this.keyHint()}` : '';
      const error = new InferenceError(`${url}: ${httpErrorText(res.status, text)}${hint}`, res.status, kind);
      if (kind === 'busy') Object.assign(error, { retryAfterMs: retryAfterMs(res.headers.get('retry-after')) });
      throw error;
    }
    return JSON.parse(text) as T;
  }

  /** One call, retried with backoff while the server is busy (429/503), `busyTimeoutMs` at most. */
  private async call<T>(
    s: Server,
    routePath: string,
    route: 'generate' | 'control',
    init?: { body?: unknown; method?: string },
  ): Promise<T> {
    if (this.fatal) throw this.fatal;
    const started = Date.now();
    for (let attempt = 0; ; attempt++) {
      try {
        return await this.once<T>(s, routePath, route, init);
      } catch (e) {
        if (!(e instanceof InferenceError) || e.kind !== 'busy') throw e;
        const backoff = Math.min(BUSY_MAX_MS, BUSY_FIRST_MS * 2 ** attempt) * (0.5 + Math.random());
        const wait = Math.max(backoff, (e as InferenceError & { retryAfterMs?: number }).retryAfterMs ?? 0);
        if (Date.now() + wait - started > this.busyTimeoutMs) {
          throw new InferenceError(
            `${e.message} (still busy after ${Math.round((Date.now() - started) / 1000)} s of retries)`,
            e.status,
            'unavailable',
          );
        }
        await sleep(wait);
        if (this.fatal) throw this.fatal;
      }
    }
  }

  /** The failure when every server is set aside: each one's last error. */
  private noServerLeft(): InferenceError {
    const why = this.fleet.map((s) => s.lastError?.message ?? `${s.url}: set aside`).join('; ');
    return new InferenceError(
      `no inference server left (${this.fleet.length} configured): ${why}`,
      undefined,
      'unavailable',
    );
  }

  /** Sets a server aside after `error`; its first probe is due `PROBE_FIRST_MS` later. */
  private setAside(server: number, error: InferenceError): void {
    const s = this.fleet[server];
    s.lastError = error;
    if (s.aside) return;
    s.aside = true;
    s.probeAt = Date.now() + PROBE_FIRST_MS;
    s.probeDelayMs = PROBE_FIRST_MS;
    this.dispatch();
  }

  /**
   * The live server with a free slot and the fewest requests in flight (ties in turn), or -1.
   * `avoid` only when it is the one live server.
   */
  private pick(avoid?: number): number {
    const n = this.fleet.length;
    const start = this.next++ % n;
    const others = this.fleet.some((s, i) => !s.aside && i !== avoid);
    let best = -1;
    for (let i = 0; i < n; i++) {
      const k = (start + i) % n;
      const s = this.fleet[k];
      if (s.aside || s.inFlight >= this.maxInFlight || (k === avoid && others)) continue;
      if (best < 0 || s.inFlight < this.fleet[best].inFlight) best = k;
    }
    return best;
  }

  /** Hands free slots to the waiters in order; with no live server, fails them all. */
  private dispatch(): void {
    if (this.fleet.every((s) => s.aside)) {
      const error = this.noServerLeft();
      for (const w of this.waiters.splice(0)) w.reject(error);
      return;
    }
    for (let i = 0; i < this.waiters.length;) {
      const server = this.pick(this.waiters[i].avoid);
      if (server < 0) {
        i++;
        continue;
      }
      this.fleet[server].inFlight++;
      this.waiters.splice(i, 1)[0].resolve(server);
    }
  }

  /** A slot on the least loaded live server; waits while every live server has `maxInFlight` requests. */
  private acquire(avoid?: number): Promise<number> {
    this.probeDue();
    if (this.fleet.every((s) => s.aside)) return Promise.reject(this.noServerLeft());
    const server = this.pick(avoid);
    if (server >= 0) {
      this.fleet[server].inFlight++;
      return Promise.resolve(server);
    }
    return new Promise((resolve, reject) => this.waiters.push({ avoid, resolve, reject }));
  }

  /** Frees a slot of `server` for the waiters. */
  private release(server: number): void {
    this.fleet[server].inFlight--;
    this.probeDue();
    this.dispatch();
  }

  /** Starts the probes that are due (they run beside the requests, never holding one up). */
  private probeDue(): void {
    const now = Date.now();
    for (const [i, s] of this.fleet.entries()) if (s.aside && !s.probing && now >= s.probeAt) void this.probe(i);
  }

  /** A set-aside server: back (at the client's policy) and given requests, or its next probe later. */
  private async probe(server: number): Promise<void> {
    const s = this.fleet[server];
    s.probing = true;
    try {
      // A policy that changed while the server was loading the old one: load the new one too.
      for (let policy = this.policy; ; policy = this.policy) {
        if (policy) await this.bringToPolicy(s, policy);
        else await this.call(s, '/health', 'control');
        if (policy === this.policy) break;
      }
      s.aside = false;
      this.dispatch();
    } catch (e) {
      if (e instanceof InferenceError && e.kind === 'config') this.fatal ??= e;
      if (e instanceof InferenceError) s.lastError = e;
      s.probeDelayMs = Math.min(PROBE_MAX_MS, s.probeDelayMs * 2);
      s.probeAt = Date.now() + s.probeDelayMs;
    } finally {
      s.probing = false;
    }
  }

  /**
   * Makes one server serve `policy` (no-op where it already does). A server that serves the same
   * version number from another folder (another run's weights/step_N, on a server that outlived
   * that run) is moved to ours; if it keeps that label for the other folder (409), it is reloaded
   * to its base model first, which starts a new lineage of labels.
   */
  private async bringToPolicy(s: Server, policy: PolicyRef): Promise<void> {
    const health = await this.call<{ policy_version: number; weight_dir?: string }>(s, '/health', 'control');
    if (
      health.policy_version === policy.version &&
      (policy.version === 0 || health.weight_dir === undefined || sameDir(health.weight_dir, policy.weightDir))
    )
      return;
    if (policy.version === 0) {
      await this.call(s, '/reload_weights', 'control', { body: {} });
      return;
    }
    const update = () =>
      this.call(s, '/update_weights', 'control', {
        body: { weight_dir: policy.weightDir, version: policy.version },
      });
    try {
      await update();
    } catch (e) {
      if (!(e instanceof InferenceError && e.status === 409)) throw e;
      await this.call(s, '/reload_weights', 'control', { body: {} });
      await update();
    }
  }

  /** The configured servers' URLs, in order. */
  get urls(): string[] {
    return this.fleet.map((s) => s.url);
  }

  /**
   * A control call to server `i` alone (the weight broadcast's routes: lib/trainer/broadcast.ts):
   * a POST of `body`, or a GET without one, with the client's key and its deadline and liveness
   * watch; no failover, and no server is set aside.
   */
  control<T>(i: number, routePath: string, body?: unknown): Promise<T> {
    return this.call<T>(this.fleet[i], routePath, 'control', body === undefined ? undefined : { body });
  }

  /**
   * Makes every live server serve `policy`. One that cannot be reached (or fails to load it,
   * `unavailable`) is set aside and brought to `policy` when a probe finds it back; with none
   * left this fails, `unavailable`. A `config` error fails it at once.
   */
  async ensurePolicy(policy: PolicyRef): Promise<void> {
    this.policy = policy;
    await Promise.all(
      this.fleet.map(async (s, i) => {
        if (s.aside) return;
        try {
          await this.bringToPolicy(s, policy);
        } catch (e) {
          if (!(e instanceof InferenceError && e.kind === 'unavailable')) throw e;
          this.setAside(i, e);
        }
      }),
    );
    if (this.fleet.every((s) => s.aside)) throw this.noServerLeft();
  }

  /**
   * One sequence from `promptIds`, on the least loaded live server; moved to another server when
   * one fails `unavailable` (2 attempts per configured server at most).
   */
  async generate(promptIds: readonly number[], params: GenerateParams): Promise<GenerateResult> {
    let avoid: number | undefined;
    for (let attempt = 1; ; attempt++) {
      if (this.fatal) throw this.fatal;
      const server = await this.acquire(avoid);
      const s = this.fleet[server];
      try {
        const body = await this.call<{
          policy_version: number;
          choices: {
            token_ids: number[];
            logprobs: number[];
            policy_versions?: number[];
            finish_reason: 'stop' | 'length' | 'abort';
            routes?: number[][];
          }[];
          prompt_routes?: number[][];
        }>(s, '/v1/generate', 'generate', {
          body: { prompt_token_ids: promptIds, ...params },
        });
        if (this.policy && body.policy_version < this.policy.version) {
          throw new InferenceError(
            `${s.url} answered from policy version ${body.policy_version}, older than ${this.policy.version} (restarted?)`,
            undefined,
            'unavailable',
          );
        }
        s.served++;
        const c = body.choices[0];
        return {
          tokenIds: c.token_ids,
          logprobs: c.logprobs,
          finishReason: c.finish_reason,
          policyVersion: body.policy_version,
          tokenPolicyVersions: c.policy_versions ?? c.token_ids.map(() => body.policy_version),
          ...(params.return_routes ? { promptRoutes: body.prompt_routes ?? [], routes: c.routes ?? [] } : {}),
        };
      } catch (e) {
        if (e instanceof InferenceError && e.kind === 'config') this.fatal ??= e;
        if (!(e instanceof InferenceError && e.kind === 'unavailable')) throw e;
        this.setAside(server, e);
        if (attempt >= 2 * this.fleet.length) throw e;
        avoid = server;
      } finally {
        this.release(server);
      }
    }
  }
}

/** Whether two paths name the same folder (as the server reports it: resolved, links followed). */
function sameDir(a: string, b: string): boolean {
  const real = (p: string) => {
    try {
      return fs.realpathSync(p);
    } catch {
      return path.resolve(p);
    }
  };
  return real(a) === real(b);
}

/** A Retry-After header (seconds, or an HTTP date) in ms, capped at 30 s; undefined when absent. */
function retryAfterMs(header: string | null): number | undefined {
  if (!header) return undefined;
  const seconds = Number(header);
  const ms = Number.isFinite(seconds) ? seconds * 1000 : Date.parse(header) - Date.now();
  return Number.isFinite(ms) ? Math.min(30_000, Math.max(0, ms)) : undefined;
}
