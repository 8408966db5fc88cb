/**
 * The difflib port against Python: every expected ratio below was computed with CPython's
 * `difflib.SequenceMatcher(...).ratio()` when this test was written (the test needs no Python).
 */
import { SequenceMatcher, sequenceRatio } from '../../lib/envs/difflib';

// 260 letters, each frequent enough (10 times) to be "popular" under autojunk (> 1 + 260 // 100).
const s260 = Array.from({ length: 260 }, (_, i) => String.fromCharCode(97 + ((i * 7) % 26))).join('');
const reverse = (t: string) => Array.from(t).reverse().join('');

// [a, b, ratio with autojunk (the default), ratio with autojunk=False]
const CASES: Array<[string, string, number, number]> = [
  ['', '', 1.0, 1.0],
  ['', 'abc', 0.0, 0.0],
  ['abc', '', 0.0, 0.0],
  ['abc', 'abc', 1.0, 1.0],
  ['abc', 'cba', 0.3333333333333333, 0.3333333333333333],
  ['hello world', 'dlrow olleh', 0.18181818181818182, 0.18181818181818182],
  ['tacocat', 'tacocat ', 0.9333333333333333, 0.9333333333333333],
  ['abcd', 'bcda', 0.75, 0.75],
  ['kitten', 'sitting', 0.6153846153846154, 0.6153846153846154],
  ['olleh', 'olleh', 1.0, 1.0],
  // Code points, not UTF-16 units: each emoji is one element, as in Python.
  ['😀a😀b', 'b😀a😀', 0.75, 0.75],
  ['\u00e9\u0301x', 'x\u0301\u00e9', 0.3333333333333333, 0.3333333333333333],
  ['the quick brown fox', 'xof nworb kciuq eht', 0.05263157894736842, 0.05263157894736842],
  // len(b) >= 200: autojunk drops every character of b and the ratio collapses.
  ['ab'.repeat(100), 'ba'.repeat(100), 0.0, 0.995],
  ['a'.repeat(199) + 'b', 'a'.repeat(200), 0.995, 0.995],
  ['x'.repeat(10) + 'a'.repeat(200) + 'y', 'a'.repeat(150) + 'x'.repeat(10), 0.8086253369272237, 0.8086253369272237],
  [s260, reverse(s260), 0.0, 0.04230769230769231],
  [s260.slice(0, 100) + 'zzzz' + s260.slice(100), s260, 0.3816793893129771, 0.6946564885496184],
  ['lorem ipsum dolor sit amet '.repeat(10), 'tema tis rolod muspi merol '.repeat(10), 0.0, 0.5925925925925926],
];

describe('difflib.SequenceMatcher port', () => {
  test.each(CASES)('ratio(%#)', (a, b, withAutojunk, withoutAutojunk) => {
    expect(sequenceRatio(a, b)).toBe(withAutojunk);
    expect(new SequenceMatcher(a, b, { autojunk: false }).ratio()).toBe(withoutAutojunk);
  });

  test('isjunk: junk elements only extend matches, as in Python', () => {
    const isSpace = (c: string) => c === ' ';
    expect(
      new SequenceMatcher('private Thread currentThread;', 'private volatile Thread currentThread;', {
        isjunk: isSpace,
      }).ratio(),
    ).toBe(0.8656716417910447);
    const m = new SequenceMatcher(' abcd', 'abcd abcd', { isjunk: isSpace });
    expect(m.getMatchingBlocks()).toEqual([
      { a: 1, b: 0, size: 4 },
      { a: 5, b: 9, size: 0 },
    ]);
    expect(m.ratio()).toBe(0.5714285714285714);
  });

  test('matching blocks are merged and end with the sentinel', () => {
    expect(new SequenceMatcher('abxcd', 'abcd').getMatchingBlocks()).toEqual([
      { a: 0, b: 0, size: 2 },
      { a: 3, b: 2, size: 2 },
      { a: 5, b: 4, size: 0 },
    ]);
    expect(new SequenceMatcher('ab'.repeat(100), 'ba'.repeat(100)).getMatchingBlocks()).toEqual([
      { a: 200, b: 200, size: 0 },
    ]);
  });
});
