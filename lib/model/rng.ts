/**
 * A small seeded PRNG for weight initialisation: xoshiro128** (32-bit arithmetic, fast in JS
 * without BigInt) seeded through splitmix32, with Box-Muller normals. Same seed and stream name
 * give the same numbers on every run; Math.log/cos/sin are V8's fdlibm ports, so results are
 * bitwise stable across machines running the same Node major version.
 */

function splitmix32(state: { s: number }): number {
  state.s = (state.s + 0x9e3779b9) | 0;
  let z = state.s;
  z = Math.imul(z ^ (z >>> 16), 0x85ebca6b);
  z = Math.imul(z ^ (z >>> 13), 0xc2b2ae35);
  return (z ^ (z >>> 16)) >>> 0;
}

/** FNV-1a over the UTF-16 code units: spreads a stream name into 32 bits. */
function fnv1a(text: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < text.length; i++) h = Math.imul(h ^ text.charCodeAt(i), 0x01000193);
  return h >>> 0;
}

export class Rng {
  private a: number;
  private b: number;
  private c: number;
  private d: number;

  /**
   * `seed` is any safe integer; `stream` names an independent sequence (e.g. a tensor name), so
   * adding or reordering tensors never changes the values of the others.
   */
  constructor(seed: number, stream = '') {
    if (!Number.isSafeInteger(seed)) throw new Error(`seed must be a safe integer, got ${seed}`);
    const state = { s: (seed >>> 0) ^ fnv1a(stream) };
    state.s ^= splitmix32({ s: Math.floor(seed / 2 ** 32) | 0 });
    this.a = splitmix32(state);
    this.b = splitmix32(state);
    this.c = splitmix32(state);
    this.d = splitmix32(state);
  }

  /** Next uniform 32-bit unsigned integer. */
  nextU32(): number {
    const result = Math.imul(rotl(Math.imul(this.b, 5), 7), 9) >>> 0;
    const t = this.b << 9;
    this.c ^= this.a;
    this.d ^= this.b;
    this.b ^= this.c;
    this.a ^= this.d;
    this.c ^= t;
    this.d = rotl(this.d, 11);
    return result;
  }

  /** Uniform in [0, 1). */
  uniform(): number {
    return this.nextU32() / 4294967296;
  }

  /** Uniform integer in [0, n). */
  int(n: number): number {
    return Math.floor(this.uniform() * n);
  }

  /** One standard normal sample (Box-Muller, cosine branch). */
  normal(): number {
    const u1 = (this.nextU32() + 0.5) / 4294967296;
    return Math.sqrt(-2 * Math.log(u1)) * Math.cos(2 * Math.PI * this.uniform());
  }

  /** Fills `out` with normal(mean, std) samples (Box-Muller, both outputs used). */
  fillNormal(out: Float32Array, mean: number, std: number): void {
    for (let i = 0; i < out.length; i += 2) {
      // u1 in (0, 1) so the log is finite; u2 in [0, 1).
      const u1 = (this.nextU32() + 0.5) / 4294967296;
      const u2 = this.nextU32() / 4294967296;
      const r = Math.sqrt(-2 * Math.log(u1));
      out[i] = mean + std * r * Math.cos(2 * Math.PI * u2);
      if (i + 1 < out.length) out[i + 1] = mean + std * r * Math.sin(2 * Math.PI * u2);
    }
  }
}

function rotl(x: number, k: number): number {
  return (x << k) | (x >>> (32 - k));
}
