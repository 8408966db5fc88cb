/**
 * How the data-parallel trainer's ranks train one step together (`trainer.world_size` > 1).
 *
 * Rank 0 is the only Temporal worker of the trainer queue. It serves a c10d TCP store at
 * `trainer.dist.host:port`; ranks 1..N-1 connect to it and do nothing but follow rank 0:
 *
 *   - A *generation* is one process group. Rank 0 forms one when it has none (at its first
 *     activity, and after any failure): it sets the store key `gen` to a fresh name, waits until
 *     every other rank has counted itself in under `<gen>/joined` (within `dist.timeout_s`, else
 *     the activity fails and Temporal retries it), then all join the group on the store prefix
 *     `<gen>/pg/`, which no earlier group used. The settings every rank must share
 *     (`dist.sharding`, `dist.backend`) come with the generation (`<gen>/settings`): a follower
 *     whose own differ refuses to join, and rank 0's activity fails naming the key.
 *   - Each trainer activity is one *job* `{op, runDir, step}`, written to `<gen>/job/<k>`; every
 *     rank then brings its runtime to `step` and does the job's collective part (lib/trainer/ranks.ts).
 *     Rank 0 alone writes the summary, weights and checkpoints.
 *   - Any failure on any rank (a dead rank breaks a collective at once, a stuck one after
 *     `dist.timeout_s`) ends the generation: rank 0 fails the activity and drops its group and
 *     runtime; followers drop theirs and wait for the next `gen`. The retried activity forms a new
 *     generation in which every rank restores from the newest checkpoint and replays the stored
 *     batches together, exactly as one trainer does after a crash. A step is applied to a runtime
 *     only at `progress.steps === step`, and a finished step is found on disk (train/step_n.json),
 *     so nothing is applied twice.
 *   - A dead rank 0 takes the store with it: followers reconnect until the restarted rank 0 serves
 *     it again; Temporal retries the activity on that rank 0 (heartbeat timeout).
 *   - Rank 0 signs each generation and each job with the ranks' shared token (the variable
 *     `dist.token_var`, never in the store): HMAC-SHA256 over the key and the value. A follower
 *     joins no generation and runs no job without rank 0's signature, so a process that reaches
 *     the store (libtorch 1.13's TCPStore listens on every interface: `native.info().storeBindsHost`)
 *     can stall a step, never steer a rank.
 */
import { createHmac, randomBytes, timingSafeEqual } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import * as native from '../../native';
import { ConfigError } from '../failures';
import { trainerRankSchema, type TrainerRankConfig } from '../config/schemas';

/**
 * One trainer activity as every rank sees it: `at` only brings the runtime to `step`; `weights`
 * and `validate` too, except under full sharding, where writing weights and scoring are collectives.
 */
export interface RankJob {
  op: 'train' | 'checkpoint' | 'at' | 'weights' | 'validate';
  runDir: string;
  step: number;
}

/** A process group generation as a rank holds it. */
export interface RankGroup {
  group: native.DistGroup;
  rank: number;
  size: number;
  bucketBytes: number;
  sharding: native.Sharding;
}

/** The settings every rank of a group must share (rank 0 publishes its own with each generation). */
type GroupSettings = Pick<TrainerRankConfig['dist'], 'sharding' | 'backend'>;
const settingsOf = (t: TrainerRankConfig): GroupSettings => ({ sharding: t.dist.sharding, backend: t.dist.backend });

/**
 * trainer.world_size > 1 needs an addon built with c10d's Gloo (native/CMakeLists.txt), and
 * trainer.dist.backend nccl one built with NCCL (PyTorch 2.x with CUDA). At world size 1 there is
 * no process group: a sharding or backend set otherwise than by default is refused, not ignored.
 */
export function checkWorldSize(t: Pick<TrainerRankConfig, 'world_size' | 'dist'>): void {
  const { world_size: worldSize, dist } = t;
  const info = native.info();
  if (worldSize > 1 && !info.gloo)
    throw new ConfigError(
      `trainer.world_size ${worldSize}: this build of the native addon has no c10d Gloo process group (its Gloo headers did not match libtorch when it was built); use trainer.world_size 1, or rebuild with matching Gloo headers`,
    );
  const defaults = trainerRankSchema.parse({}).dist;
  for (const key of ['sharding', 'backend'] as const)
    if (worldSize === 1 && dist[key] !== defaults[key])
      throw new ConfigError(
        `trainer.dist.${key} ${dist[key]}: a single trainer rank (trainer.world_size 1) has no process group to shard over or move tensors with; set trainer.world_size above 1, or leave trainer.dist.${key} at its default (${defaults[key]})`,
      );
  const backend = dist.backend;
  if (backend === 'nccl' && !info.nccl)
    throw new ConfigError(
      `trainer.dist.backend nccl: this build of the native addon has no NCCL (only a build against a PyTorch 2.x with CUDA has it); use trainer.dist.backend auto or gloo`,
    );
}

const where = (t: TrainerRankConfig) => `${t.dist.host}:${t.dist.port}`;

/**
 * The ranks' shared token, from the variable `trainer.dist.token_var` (a ConfigError naming both
 * if it is not set): what rank 0 signs generations and jobs with.
 */
export function distToken(t: Pick<TrainerRankConfig, 'dist'>, env: NodeJS.ProcessEnv = process.env): string {
  const token = env[t.dist.token_var];
  if (!token)
    throw new ConfigError(
      `trainer.dist.token_var: the variable ${t.dist.token_var} is not set; rank 0 signs what it hands the other ranks through its store with it (the store may be reachable from other hosts), and they act on nothing unsigned: set the same secret on every rank (rl and sft set one for the ranks they start)`,
    );
  return token;
}

/** A fresh token for ranks a launcher starts itself. */
export const newDistToken = (): string => randomBytes(32).toString('hex');

/** The signature of `value` stored under `key`. */
const sign = (token: string, key: string, value: string) =>
  createHmac('sha256', token).update(key).update('\0').update(value).digest('hex');

/** A value and its signature, as rank 0 stores it. */
const signed = (token: string, key: string, value: string) => JSON.stringify({ value, mac: sign(token, key, value) });

/** The value stored under `key` if rank 0 signed it with `token`, else undefined. */
function verified(token: string, key: string, stored: string): string | undefined {
  let parsed: { value?: unknown; mac?: unknown };
  try {
    parsed = JSON.parse(stored) as typeof parsed;
  } catch {
    return undefined;
  }
  if (typeof parsed.value !== 'string' || typeof parsed.mac !== 'string') return undefined;
  const want = Buffer.from(sign(token, key, parsed.value), 'hex');
  const got = Buffer.from(parsed.mac, 'hex');
  return got.length === want.length && timingSafeEqual(got, want) ? parsed.value : undefined;
}

/** The store error of a rank that cannot bind or reach `trainer.dist.host:port`, as a config error. */
function storeError(t: TrainerRankConfig, e: unknown): ConfigError {
  const key = 'trainer.dist.host / trainer.dist.port';
  const what =
    t.rank === 0
      ? `rank 0 serves the trainer's TCP store there; give an address of this host and a free port`
      : `rank 0 (\`prime-rl worker --pool trainer --trainer.rank 0\`) serves it; is it running, and reachable at that address?`;
  return new ConfigError(`${key} (${where(t)}): ${(e as Error).message}; ${what}`);
}

/** Rank 0's side: the store, the current generation, the jobs it hands out. */
export class GroupLeader {
  private readonly nonce = randomBytes(4).toString('hex');
  private generation = 0;
  private current?: { name: string; group: RankGroup; jobs: number };

  private constructor(
    readonly config: TrainerRankConfig,
    private readonly store: native.DistStore,
    private readonly token: string,
  ) {}

  /**
   * Serves the store at trainer.dist.host:port (a ConfigError naming the keys if it cannot), signing
   * with `token` (by default the variable trainer.dist.token_var names).
   */
  static async start(config: TrainerRankConfig, token = distToken(config)): Promise<GroupLeader> {
    if (config.rank !== 0) throw new Error('GroupLeader is rank 0');
    try {
      const store = await native.createStore({
        host: config.dist.host,
        port: config.dist.port,
        isServer: true,
        timeoutS: config.dist.timeout_s,
      });
      return new GroupLeader(config, store, token);
    } catch (e) {
      throw storeError(config, e);
    }
  }

  get port(): number {
    return this.store.port();
  }

  /** The current generation's group, or a new one once every rank has joined (`fresh`). */
  async ensure(): Promise<{ group: RankGroup; fresh: boolean }> {
    if (this.current) return { group: this.current.group, fresh: false };
    const { world_size: size, dist } = this.config;
    const name = `${this.nonce}.${++this.generation}`;
    await this.store.set(
      `${name}/settings`,
      signed(this.token, `${name}/settings`, JSON.stringify(settingsOf(this.config))),
    );
    await this.store.set('gen', signed(this.token, 'gen', name));
    const deadline = Date.now() + dist.timeout_s * 1000;
    for (;;) {
      if ((await this.store.add(`${name}/refused`, 0)) > 0) {
        const reasons: string[] = [];
        for (let r = 1; r < size; r++) {
          const why = await this.store.get(`${name}/refused/${r}`, 1).catch(() => null);
          if (why) reasons.push(`rank ${r}: ${why}`);
        }
        throw new Error(`trainer ranks refused to join: ${reasons.join('; ')}`);
      }
      const joined = await this.store.add(`${name}/joined`, 0);
      if (joined >= size - 1) break;
      if (Date.now() > deadline)
        throw new Error(
          `trainer ranks: ${joined} of ${size - 1} followers joined within trainer.dist.timeout_s (${dist.timeout_s} s); ` +
            `start \`prime-rl worker --pool trainer --trainer.rank R --trainer.world-size ${size}\` for every R in 1..${size - 1}, pointed at ${where(this.config)}`,
        );
      await sleep(100);
    }
    this.current = { name, group: await joinGroup(this.store, name, this.config), jobs: 0 };
    return { group: this.current.group, fresh: true };
  }

  /** Hands `job` to every follower of the current generation. */
  async dispatch(job: RankJob): Promise<void> {
    const c = this.current;
    if (!c) throw new Error('dispatch: no process group (call ensure first)');
    const key = `${c.name}/job/${c.jobs++}`;
    await this.store.set(key, signed(this.token, key, JSON.stringify(job)));
  }

  /**
   * Ends the current generation after a failure: the next activity forms a new one. Returns what
   * the followers reported failing in it (for the activity's error).
   */
  async invalidate(): Promise<string[]> {
    const c = this.current;
    this.current = undefined;
    if (!c) return [];
    const reports: string[] = [];
    for (let r = 1; r < this.config.world_size; r++) {
      const e = await this.store.get(`${c.name}/error/${r}`, 1).catch(() => null);
      if (e) reports.push(`rank ${r}: ${e}`);
    }
    return reports;
  }
}

export function bucketBytes(t: TrainerRankConfig): number {
  return Math.round(t.dist.bucket_mb * 1024 * 1024);
}

/** This rank's process group of generation `name`. */
async function joinGroup(store: native.DistStore, name: string, t: TrainerRankConfig): Promise<RankGroup> {
  const { rank, world_size: size, dist } = t;
  const group = await native.createGroup(store, {
    prefix: `${name}/pg/`,
    rank,
    size,
    timeoutS: dist.timeout_s,
    backend: dist.backend,
  });
  return { group, rank, size, bucketBytes: bucketBytes(t), sharding: dist.sharding };
}

/** Why this rank cannot join a group whose rank 0 has `theirs` (the same keys, other values), or undefined. */
function settingsMismatch(t: TrainerRankConfig, theirs: GroupSettings): string | undefined {
  const ours = settingsOf(t);
  const differ = (Object.keys(ours) as (keyof GroupSettings)[]).filter((k) => ours[k] !== theirs[k]);
  if (differ.length === 0) return undefined;
  return differ
    .map((k) => `trainer.dist.${k} is '${ours[k]}' here and '${theirs[k]}' on rank 0; give every rank the same`)
    .join('; ');
}

/**
 * A follower rank (1..world_size-1), until `stopped()`: joins every generation rank 0 forms and
 * runs its jobs with `execute`; `reset` drops the rank's runtime when a generation ends. The first
 * connection to the store must succeed within `dist.timeout_s` (else a ConfigError naming the
 * keys); later losses of it (rank 0 restarting) are waited out.
 */
export async function runFollower(
  config: TrainerRankConfig,
  hooks: {
    execute: (job: RankJob, group: RankGroup) => Promise<void>;
    reset: () => void;
    log: (line: string) => void;
    stopped: () => boolean;
  },
  token = distToken(config),
): Promise<void> {
  const { rank, world_size: size, dist } = config;
  const connect = () =>
    native.createStore({ host: dist.host, port: dist.port, isServer: false, timeoutS: dist.timeout_s });
  let store: native.DistStore;
  try {
    store = await connect();
  } catch (e) {
    throw storeError(config, e);
  }
  let seen: string | null = null;
  while (!hooks.stopped()) {
    try {
      const announced = await store.get('gen', 1000);
      if (announced === null || announced === seen) continue;
      seen = announced;
      hooks.reset();
      const name = verified(token, 'gen', announced);
      if (name === undefined) {
        hooks.log(
          `rank ${rank}: a process group announced in the store is not signed with this rank's token (${dist.token_var}): not joining (rank 0 has another token, or another process writes to the store)`,
        );
        continue;
      }
      // A generation every other rank has joined already (this rank restarted into it) is one it
      // cannot be part of: wait for the next, which rank 0 forms once this one fails.
      if ((await store.add(`${name}/joined`, 0)) >= size - 1) continue;
      const stored = await store.get(`${name}/settings`, 1000);
      const settings = stored === null ? undefined : verified(token, `${name}/settings`, stored);
      const mismatch =
        settings === undefined ? undefined : settingsMismatch(config, JSON.parse(settings) as GroupSettings);
      if (mismatch) {
        hooks.log(`rank ${rank}: not joining trainer process group ${name}: ${mismatch}`);
        await store.set(`${name}/refused/${rank}`, mismatch);
        await store.add(`${name}/refused`, 1);
        continue;
      }
      await store.add(`${name}/joined`, 1);
      hooks.log(`rank ${rank}: joining trainer process group ${name}`);
      let group: RankGroup;
      try {
        group = await joinGroup(store, name, config);
      } catch (e) {
        hooks.log(`rank ${rank}: group ${name} not formed: ${(e as Error).message}`);
        continue;
      }
      try {
        for (let k = 0; !hooks.stopped();) {
          const key = `${name}/job/${k}`;
          const stored = await store.get(key, 1000);
          if (stored === null) {
            if ((await store.get('gen', 1000)) !== announced) break; // rank 0 moved on
            continue;
          }
          const job = verified(token, key, stored);
          if (job === undefined)
            throw new Error(
              `job ${k} is not signed with this rank's token (${dist.token_var}): another process wrote to the store; not run`,
            );
          await hooks.execute(JSON.parse(job) as RankJob, group);
          k++;
        }
      } catch (e) {
        const message = (e as Error).message;
        hooks.log(`rank ${rank}: group ${name} ended: ${message}`);
        await store.set(`${name}/error/${rank}`, message).catch(() => undefined);
      }
      hooks.reset();
    } catch (e) {
      // The store is gone (rank 0 died): reconnect until it is back.
      hooks.log(`rank ${rank}: trainer store ${where(config)} lost (${(e as Error).message}); reconnecting`);
      hooks.reset();
      seen = null;
      for (;;) {
        if (hooks.stopped()) return;
        try {
          store = await connect();
          break;
        } catch {
          await sleep(1000);
        }
      }
    }
  }
}
