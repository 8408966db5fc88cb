/**
 * A faithful port of the parts of Python's `difflib.SequenceMatcher` that `ratio()` needs
 * (CPython 3.x, Lib/difflib.py): the b2j index with junk and "popular" (autojunk) elements,
 * `find_longest_match`, `get_matching_blocks` and `ratio`. Rewards of the reverse-text task are
 * defined as `SequenceMatcher(None, parsed, answer).ratio()`, so every detail matters: with
 * autojunk, which longest match is found first decides the result, and that is not the longest
 * common subsequence.
 *
 * Strings are compared by Unicode code point, as Python does (a JS string's `length` counts UTF-16
 * units, which would change the ratio for astral characters).
 */

/** A matching block: `a[a .. a+size) == b[b .. b+size)`. */
export interface Match {
  a: number;
  b: number;
  size: number;
}

export interface SequenceMatcherOptions {
  /** Python's `isjunk`: elements of b for which it returns true are junk. */
  isjunk?: (element: string) => boolean;
  /** Python's `autojunk` (default true): for len(b) >= 200, elements more frequent than 1% are ignored. */
  autojunk?: boolean;
}

export class SequenceMatcher {
  private readonly a: readonly string[];
  private readonly b: readonly string[];
  /** Element of b -> increasing indices where it occurs, without junk and popular elements. */
  private readonly b2j = new Map<string, number[]>();
  private readonly bjunk = new Set<string>();
  private matchingBlocks: Match[] | undefined;

  /** `a` and `b` are strings (split into code points) or sequences of hashable elements. */
  constructor(a: string | readonly string[], b: string | readonly string[], opts: SequenceMatcherOptions = {}) {
    this.a = typeof a === 'string' ? Array.from(a) : a;
    this.b = typeof b === 'string' ? Array.from(b) : b;
    this.chainB(opts.isjunk, opts.autojunk ?? true);
  }

  /** Python's `__chain_b`. */
  private chainB(isjunk: ((element: string) => boolean) | undefined, autojunk: boolean): void {
    const { b, b2j } = this;
    for (let i = 0; i < b.length; i++) {
      const indices = b2j.get(b[i]);
      if (indices) indices.push(i);
      else b2j.set(b[i], [i]);
    }
    if (isjunk) {
      for (const element of b2j.keys()) if (isjunk(element)) this.bjunk.add(element);
      for (const element of this.bjunk) b2j.delete(element);
    }
    // Popular elements are removed from the index but are *not* junk: the extension loops of
    // findLongestMatch may still grow a match over them.
    const n = b.length;
    if (autojunk && n >= 200) {
      const ntest = Math.floor(n / 100) + 1;
      const popular: string[] = [];
      for (const [element, indices] of b2j) if (indices.length > ntest) popular.push(element);
      for (const element of popular) b2j.delete(element);
    }
  }

  /**
   * Longest matching block in a[alo..ahi) x b[blo..bhi) among those free of indexed-out elements,
   * earliest in a (then in b) on ties, then extended over junk on both sides, as Python does.
   */
  findLongestMatch(alo = 0, ahi = this.a.length, blo = 0, bhi = this.b.length): Match {
    const { a, b, b2j, bjunk } = this;
    let besti = alo;
    let bestj = blo;
    let bestsize = 0;
    // j2len.get(j) = length of the longest match ending with a[i-1] and b[j].
    let j2len = new Map<number, number>();
    for (let i = alo; i < ahi; i++) {
      const newj2len = new Map<number, number>();
      const indices = b2j.get(a[i]);
      if (indices) {
        for (const j of indices) {
          if (j < blo) continue;
          if (j >= bhi) break;
          const k = (j2len.get(j - 1) ?? 0) + 1;
          newj2len.set(j, k);
          if (k > bestsize) {
            besti = i - k + 1;
            bestj = j - k + 1;
            bestsize = k;
          }
        }
      }
      j2len = newj2len;
    }

    // Extend with equal non-junk elements (popular ones were excluded from b2j only), then with
    // equal junk elements, exactly in Python's order: backwards, then forwards, for each kind.
    const extend = (junk: boolean) => {
      while (besti > alo && bestj > blo && bjunk.has(b[bestj - 1]) === junk && a[besti - 1] === b[bestj - 1]) {
        besti--;
        bestj--;
        bestsize++;
      }
      while (
        besti + bestsize < ahi &&
        bestj + bestsize < bhi &&
        bjunk.has(b[bestj + bestsize]) === junk &&
        a[besti + bestsize] === b[bestj + bestsize]
      ) {
        bestsize++;
      }
    };
    extend(false);
    extend(true);
    return { a: besti, b: bestj, size: bestsize };
  }

  /**
   * Non-overlapping matching blocks in increasing order, adjacent blocks merged, ending with the
   * sentinel `{a: len(a), b: len(b), size: 0}`.
   */
  getMatchingBlocks(): Match[] {
    if (this.matchingBlocks) return this.matchingBlocks;
    const la = this.a.length;
    const lb = this.b.length;
    // Python pops from the end of a list (LIFO); the order does not change the final sorted set
    // but is kept for fidelity.
    const queue: Array<[number, number, number, number]> = [[0, la, 0, lb]];
    const blocks: Match[] = [];
    while (queue.length > 0) {
      const [alo, ahi, blo, bhi] = queue.pop()!;
      const m = this.findLongestMatch(alo, ahi, blo, bhi);
      if (m.size > 0) {
        blocks.push(m);
        if (alo < m.a && blo < m.b) queue.push([alo, m.a, blo, m.b]);
        if (m.a + m.size < ahi && m.b + m.size < bhi) queue.push([m.a + m.size, ahi, m.b + m.size, bhi]);
      }
    }
    blocks.sort((x, y) => x.a - y.a || x.b - y.b || x.size - y.size);

    const merged: Match[] = [];
    let i1 = 0;
    let j1 = 0;
    let k1 = 0;
    for (const { a: i2, b: j2, size: k2 } of blocks) {
      if (i1 + k1 === i2 && j1 + k1 === j2) {
        k1 += k2;
      } else {
        if (k1 > 0) merged.push({ a: i1, b: j1, size: k1 });
        i1 = i2;
        j1 = j2;
        k1 = k2;
      }
    }
    if (k1 > 0) merged.push({ a: i1, b: j1, size: k1 });
    merged.push({ a: la, b: lb, size: 0 });
    this.matchingBlocks = merged;
    return merged;
  }

  /** 2 * M / T, where M = matched elements and T = len(a) + len(b); 1.0 when both are empty. */
  ratio(): number {
    let matches = 0;
    for (const block of this.getMatchingBlocks()) matches += block.size;
    const total = this.a.length + this.b.length;
    return total > 0 ? (2.0 * matches) / total : 1.0;
  }
}

/** `difflib.SequenceMatcher(None, a, b).ratio()`. */
export function sequenceRatio(a: string, b: string): number {
  return new SequenceMatcher(a, b).ratio();
}
