/**
 * Trainer rank 0's side of `weight_broadcast.type = "nccl"` (the servers': lib/inference/server/
 * weight-receiver.ts): each new policy version goes to the inference servers over a c10d process
 * group that rank 0 forms with them (NCCL between CUDA devices where the build has it, Gloo
 * otherwise), unit by unit as the trainer writes it, so that no server reads the version's folder.
 *
 * Rank 0 drives the servers over their HTTP control routes:
 *   - A *generation* is one group: rank 0 serves a store at `weight_broadcast.host:port` (kept for
 *     the worker's life), asks every server to join a fresh generation (`/weights/join`, rank i+1 of
 *     1 + the servers that answered) and joins it as rank 0, within `timeout_s`.
 *   - A version: rank 0 asks each member to receive it (`/weights/receive`, with the tensors' names,
 *     dtypes and shapes unit by unit) and broadcasts each unit's bytes as it is read for the folder;
 *     each member answers once it holds the whole version, and loads it at its `/update_weights`.
 *
 * The folder is written all the same: it is what a server that joined late, restarted, or missed a
 * version loads, and what a resume reads. A broadcast never fails a step: a server that cannot be
 * reached is left out, and a group that breaks (a member killed mid-version, a timeout) is dropped
 * (the next version forms a new one) while the units left are written to the folder alone.
 */
import { randomBytes } from 'node:crypto';
import * as native from '../../native';
import type { WeightTensor } from '../model/arch';
import type { TensorEntry } from '../model/safetensors';

/** The servers a broadcast reaches, and how to call their control routes. */
export interface BroadcastServers {
  /** The servers' names (their URLs), in order. */
  names: readonly string[];
  /** A control route of server `i`: POSTs `body`, or GETs without one; rejects when it fails or cannot be reached. */
  post<T>(i: number, route: string, body?: unknown): Promise<T>;
}

export interface BroadcastSettings {
  host: string;
  port: number;
  timeoutS: number;
  bucketBytes: number;
  /** Where the bytes travel through: cpu (Gloo), or the trainer's CUDA device (NCCL). */
  device: string;
}

/** What a version's broadcast reached. */
export interface BroadcastReport {
  version: number;
  /** The servers that hold the version now. */
  received: string[];
  /** Why the others do not (a server left out of the group, a broken group). */
  missed: string[];
  bytes: number;
  seconds: number;
}

/** A version on its way: `unit` sends each unit (in order), `end` waits for the servers. */
export interface BroadcastVersion {
  unit(u: number, tensors: readonly WeightTensor[]): Promise<void>;
  end(): Promise<BroadcastReport>;
}

/** A group generation: its name, its process group, and which servers are its ranks 1..n. */
interface Generation {
  name: string;
  group: native.DistGroup;
  members: number[];
}

export class WeightBroadcaster {
  private store?: native.DistStore;
  private readonly nonce = randomBytes(4).toString('hex');
  private generations = 0;
  private current?: Generation;

  constructor(
    private readonly settings: BroadcastSettings,
    private readonly log: { info(line: string): void; warn(line: string): void },
  ) {}

  /** The store's port (after the first version; `port` 0 picks one). */
  get port(): number | undefined {
    return this.store?.port();
  }

  /**
   * Starts broadcasting `version` (to be loaded as `weightDir`), whose tensors come in `units` (as
   * `TrainerRuntime.writeWeights` reads them), to `servers`; undefined when no group could be formed
   * (every server then reads the folder).
   */
  async begin(
    version: number,
    weightDir: string,
    units: readonly (readonly TensorEntry[])[],
    servers: BroadcastServers,
  ): Promise<BroadcastVersion | undefined> {
    const started = performance.now();
    // A server outside the group that answers now (one that joined late, or came back) is taken in:
    // the group is formed anew.
    if (this.current && (await this.outsiders(servers, this.current)).length > 0) this.current = undefined;
    const generation = this.current ?? (await this.form(servers));
    if (!generation) return undefined;
    const { name, group, members } = generation;
    const missed = new Map<number, string>(
      servers.names
        .map((_, i) => i)
        .filter((i) => !members.includes(i))
        .map((i) => [i, 'not in the group']),
    );
    const receives = members.map((i) =>
      servers
        .post<{ bytes: number }>(i, '/weights/receive', {
          generation: name,
          version,
          weight_dir: weightDir,
          units: units.map((u) => u.map(({ name: n, dtype, shape }) => ({ name: n, dtype, shape }))),
          bucket_bytes: this.settings.bucketBytes,
        })
        .then(
          () => undefined,
          (e: Error) => void missed.set(i, e.message),
        ),
    );
    let broken: string | undefined;
    let bytes = 0;
    return {
      unit: async (u, tensors) => {
        if (broken !== undefined) return;
        try {
          await native.broadcastBuffers(
            group,
            tensors.map((t) => t.data),
            { root: 0, bucketBytes: this.settings.bucketBytes, device: this.settings.device },
          );
          for (const t of tensors) bytes += t.data.length;
        } catch (e) {
          broken = (e as Error).message;
          if (this.current === generation) this.current = undefined; // the next version forms a new one
          this.log.warn(`weight broadcast of version ${version} broke at unit ${u} (${broken}): the folder serves it`);
        }
      },
      end: async () => {
        await Promise.all(receives);
        if (broken !== undefined) for (const i of members) if (!missed.has(i)) missed.set(i, `broken: ${broken}`);
        // A member that failed to receive has left the generation: the next version forms a new one.
        if (members.some((i) => missed.has(i)) && this.current === generation) this.current = undefined;
        const report: BroadcastReport = {
          version,
          received: servers.names.filter((_, i) => !missed.has(i)),
          missed: [...missed].map(([i, why]) => `${servers.names[i]}: ${why}`),
          bytes,
          seconds: (performance.now() - started) / 1000,
        };
        return report;
      },
    };
  }

  /** The servers outside `g` that answer `/health`. */
  private async outsiders(servers: BroadcastServers, g: Generation): Promise<number[]> {
    const out = servers.names.map((_, i) => i).filter((i) => !g.members.includes(i));
    const live = await Promise.all(out.map((i) => this.answers(servers, i)));
    return out.filter((_, k) => live[k]);
  }

  private answers(servers: BroadcastServers, i: number): Promise<boolean> {
    return servers.post(i, '/health').then(
      () => true,
      () => false,
    );
  }

  /** A new generation with every server that answers, or undefined when none does or it fails to form. */
  private async form(servers: BroadcastServers): Promise<Generation | undefined> {
    const s = this.settings;
    try {
      this.store ??= await native.createStore({ host: s.host, port: s.port, isServer: true, timeoutS: s.timeoutS });
    } catch (e) {
      this.log.warn(
        `weight broadcast: cannot serve its store at ${s.host}:${s.port} (${(e as Error).message}); the folders serve`,
      );
      return undefined;
    }
    const name = `${this.nonce}.${++this.generations}`;
    // Ranks are handed out in the order the servers are listed; one that does not answer is left out.
    const answered = await Promise.all(servers.names.map((_, i) => this.answers(servers, i)));
    const members = servers.names.map((_, i) => i).filter((i) => answered[i]);
    if (members.length === 0) return undefined;
    const size = members.length + 1;
    try {
      await Promise.all(
        members.map((i, r) =>
          servers.post(i, '/weights/join', {
            generation: name,
            store: `${s.host}:${this.store!.port()}`,
            rank: r + 1,
            size,
            timeout_s: s.timeoutS,
            device: s.device,
          }),
        ),
      );
      const group = await native.createGroup(this.store, { prefix: `${name}/`, rank: 0, size, timeoutS: s.timeoutS });
      this.current = { name, group, members };
      this.log.info(`weight broadcast group ${name} formed with ${members.map((i) => servers.names[i]).join(', ')}`);
      return this.current;
    } catch (e) {
      this.log.warn(`weight broadcast group ${name} not formed (${(e as Error).message}); the folders serve`);
      return undefined;
    }
  }
}
