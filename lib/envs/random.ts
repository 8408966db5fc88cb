/** Seeded draws for dataset generation and the env mix, on the project's xoshiro128** Rng. */
import { Rng } from '../model/rng';

export { Rng };

const TWO_32 = 4294967296;

/** Uniform integer in [lo, hi] (inclusive), unbiased: rejects the top partial block of 2^32. */
export function uniformInt(rng: Rng, lo: number, hi: number): number {
  const span = hi - lo + 1;
  if (!Number.isInteger(lo) || !Number.isInteger(hi) || span < 1 || span > TWO_32) {
    throw new Error(`uniformInt: bad range [${lo}, ${hi}]`);
  }
  const limit = TWO_32 - (TWO_32 % span);
  let x = rng.nextU32();
  while (x >= limit) x = rng.nextU32();
  return lo + (x % span);
}

/** Uniform float in [0, 1). */
export function uniform(rng: Rng): number {
  return rng.nextU32() / TWO_32;
}

export function pick<T>(rng: Rng, items: readonly T[]): T {
  if (items.length === 0) throw new Error('pick: no items');
  return items[uniformInt(rng, 0, items.length - 1)];
}

/** Fisher-Yates shuffle of `items`, in place. */
export function shuffle<T>(rng: Rng, items: T[]): T[] {
  for (let i = items.length - 1; i > 0; i--) {
    const j = uniformInt(rng, 0, i);
    [items[i], items[j]] = [items[j], items[i]];
  }
  return items;
}

/** A well-mixed 32-bit hash of a string (FNV-1a, then murmur3's finaliser). */
export function hash32(text: string): number {
  let h = 0x811c9dc5;
  for (let i = 0; i < text.length; i++) h = Math.imul(h ^ text.charCodeAt(i), 0x01000193);
  h = Math.imul(h ^ (h >>> 16), 0x85ebca6b);
  h = Math.imul(h ^ (h >>> 13), 0xc2b2ae35);
  return (h ^ (h >>> 16)) >>> 0;
}
