/**
 * The environment mix (`[[env]] id, args, weight`): which (env, example index) pairs step n trains
 * on, as a pure function of (seed, step), so a retried or resumed step draws the same examples.
 *
 * - Per step, envs get their share by systematic sampling: with B examples per step, env k gets
 *   floor or ceil of B * w_k / sum(w), with one uniform offset deciding the remainders. That keeps
 *   every step close to the configured proportions, unlike B independent draws.
 * - Within an env, examples are taken without replacement: the m-th draw of env k takes element
 *   m mod N_k of a seeded permutation of its N_k train examples, reshuffled each epoch. Generated
 *   envs (no size) simply take index m, so no example repeats.
 * Counting the draws of earlier steps replays the (cheap) per-step allocation from step 0; it is
 * cached, so steady progress costs O(B) per step.
 */
import { Rng, shuffle, uniform } from './random';

export interface MixEntry {
  weight: number;
  /** Train examples of the env; null or absent for a generated (unbounded) dataset. */
  size?: number | null;
}

export interface MixDraw {
  /** Index into the entries. */
  env: number;
  /** Example index within the env's train split. */
  index: number;
  /** Pass over the env's dataset this draw belongs to (always 0 for generated datasets). */
  epoch: number;
}

export interface EnvMixOptions {
  seed: number;
  /** Examples per step (batch_size / rollouts_per_example). */
  examplesPerStep: number;
}

export class EnvMix {
  private readonly cumulative: number[];
  private readonly seed: number;
  private readonly perStep: number;
  /** drawsBefore[s][k]: draws of env k in steps < s. */
  private readonly drawsBefore: number[][];
  private readonly permutations = new Map<string, number[]>();

  constructor(
    private readonly entries: readonly MixEntry[],
    opts: EnvMixOptions,
  ) {
    if (entries.length === 0) throw new Error('env mix: no environments');
    for (const [i, e] of entries.entries()) {
      if (!(e.weight > 0) || !Number.isFinite(e.weight))
        throw new Error(`env mix: entry ${i} has weight ${e.weight}; weights must be positive`);
      if (e.size != null && (!Number.isInteger(e.size) || e.size < 1)) {
        throw new Error(`env mix: entry ${i} has ${e.size} train examples; need at least 1`);
      }
    }
    if (!Number.isInteger(opts.examplesPerStep) || opts.examplesPerStep < 1) {
      throw new Error(`env mix: examplesPerStep must be a positive integer, got ${opts.examplesPerStep}`);
    }
    // Any finite positive weights: a sum near Number.MAX_VALUE (1e308 twice) overflows to Infinity,
    // which made every share but the last 0, so such weights are first scaled by the largest
    // (only then: the shares of other weights stay bit for bit what earlier runs drew).
    const sum = (scale: number) => entries.reduce((s, e) => s + e.weight / scale, 0);
    const scale = Number.isFinite(sum(1)) ? 1 : Math.max(...entries.map((e) => e.weight));
    const total = sum(scale);
    let acc = 0;
    this.cumulative = entries.map((e) => (acc += e.weight / scale / total));
    this.seed = opts.seed;
    this.perStep = opts.examplesPerStep;
    this.drawsBefore = [entries.map(() => 0)];
  }

  /** The examples of `step`, in a seeded random order. */
  sample(step: number): MixDraw[] {
    if (!Number.isSafeInteger(step) || step < 0)
      throw new Error(`env mix: step must be a non-negative integer, got ${step}`);
    const taken = [...this.countsBefore(step)];
    return this.allocate(step).map((env) => {
      const ordinal = taken[env]++;
      const size = this.entries[env].size;
      if (size == null) return { env, index: ordinal, epoch: 0 };
      const epoch = Math.floor(ordinal / size);
      return { env, index: this.permutation(env, epoch, size)[ordinal % size], epoch };
    });
  }

  /** Env of each slot of `step`: systematic sampling over the cumulative weights, then shuffled. */
  private allocate(step: number): number[] {
    const rng = new Rng(this.seed, `env-mix/step/${step}`);
    const offset = uniform(rng);
    const envs: number[] = [];
    let k = 0;
    for (let i = 0; i < this.perStep; i++) {
      const u = (i + offset) / this.perStep;
      while (k < this.cumulative.length - 1 && u >= this.cumulative[k]) k++;
      envs.push(k);
    }
    return shuffle(rng, envs);
  }

  private countsBefore(step: number): readonly number[] {
    while (this.drawsBefore.length <= step) {
      const s = this.drawsBefore.length - 1;
      const next = [...this.drawsBefore[s]];
      for (const env of this.allocate(s)) next[env]++;
      this.drawsBefore.push(next);
    }
    return this.drawsBefore[step];
  }

  private permutation(env: number, epoch: number, size: number): number[] {
    const key = `${env}/${epoch}`;
    let p = this.permutations.get(key);
    if (!p) {
      p = shuffle(
        new Rng(this.seed, `env-mix/env/${env}/epoch/${epoch}`),
        Array.from({ length: size }, (_, i) => i),
      );
      // Keep one epoch per env: draws move forward through epochs.
      for (const k of this.permutations.keys()) if (k.startsWith(`${env}/`)) this.permutations.delete(k);
      this.permutations.set(key, p);
    }
    return p;
  }
}
