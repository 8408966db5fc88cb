/** Eval metrics, results files and the terminal table. */
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import {
  evalResultsFile,
  passAtK,
  passAtKValues,
  readEvalResults,
  renderEvalTable,
  summarizeEnvEval,
  writeEvalResults,
  type EvalResults,
} from '../../lib/eval';

function binomial(n: number, k: number): bigint {
  if (k < 0 || k > n) return 0n;
  let r = 1n;
  for (let i = 1; i <= k; i++) r = (r * BigInt(n - k + i)) / BigInt(i);
  return r;
}

describe('pass@k', () => {
  test('matches 1 - C(n-c,k)/C(n,k) computed exactly', () => {
    for (let n = 1; n <= 12; n++) {
      for (let c = 0; c <= n; c++) {
        for (let k = 1; k <= n; k++) {
          const exact = 1 - Number((binomial(n - c, k) * 1_000_000_000_000n) / binomial(n, k)) / 1e12;
          expect(passAtK(n, c, k)).toBeCloseTo(exact, 10);
        }
      }
    }
  });

  test('edge cases and large n stay finite', () => {
    expect(passAtK(5, 0, 3)).toBe(0);
    expect(passAtK(5, 5, 1)).toBe(1);
    expect(passAtK(10, 3, 1)).toBeCloseTo(0.3, 12);
    expect(passAtK(4, 2, 3)).toBe(1); // n - c < k: every draw of 3 holds a correct one
    const big = passAtK(1000, 1, 500);
    expect(big).toBeCloseTo(0.5, 12);
    expect(() => passAtK(3, 4, 1)).toThrow('pass@k needs integers 0 <= c <= n and 1 <= k <= n, got n=3 c=4 k=1');
    expect(passAtKValues(8)).toEqual([1, 2, 4, 8]);
    expect(passAtKValues(6)).toEqual([1, 2, 4, 6]);
    expect(passAtKValues(1)).toEqual([1]);
  });
});

describe('summarizeEnvEval', () => {
  test('binary rewards: avg@k, pass@k, std and tokens', () => {
    const m = summarizeEnvEval([
      { rewards: [1, 0, 0, 0], completionTokens: [10, 20, 30, 40] },
      { rewards: [1, 1, 1, 1], completionTokens: [5, 5, 5, 5] },
      { rewards: [0, 0, 0, 0], completionTokens: [1, 1, 1, 1] },
    ]);
    expect(m.num_examples).toBe(3);
    expect(m.rollouts_per_example).toBe(4);
    expect(m.avg_at_k).toBeCloseTo((0.25 + 1 + 0) / 3, 12);
    expect(m.pass_at_k).toEqual({ '1': expect.any(Number), '2': expect.any(Number), '4': expect.any(Number) });
    expect(m.pass_at_k!['1']).toBeCloseTo((0.25 + 1 + 0) / 3, 12);
    expect(m.pass_at_k!['2']).toBeCloseTo((0.5 + 1 + 0) / 3, 12);
    expect(m.pass_at_k!['4']).toBeCloseTo(2 / 3, 12);
    const p = 5 / 12;
    expect(m.reward_std).toBeCloseTo(Math.sqrt(p * (1 - p)), 12);
    expect(m.completion_tokens_mean).toBeCloseTo((100 + 20 + 4) / 12, 12);
  });

  test('graded rewards have no pass@k; uneven k is an error', () => {
    expect(summarizeEnvEval([{ rewards: [0.5, 1], completionTokens: [1, 1] }]).pass_at_k).toBeNull();
    expect(() =>
      summarizeEnvEval([
        { rewards: [1], completionTokens: [1] },
        { rewards: [1, 0], completionTokens: [1, 1] },
      ]),
    ).toThrow('eval metrics: example 1 has 2 samples, expected 1');
    expect(() => summarizeEnvEval([{ rewards: [1], completionTokens: [] }])).toThrow(/1 rewards but 0 token counts/);
    expect(() => summarizeEnvEval([])).toThrow('eval metrics: no examples');
  });
});

describe('results files and table', () => {
  const env = (avg: number, pass: Record<string, number> | null, k = 2) => ({
    num_examples: 8,
    rollouts_per_example: k,
    avg_at_k: avg,
    reward_std: 0.25,
    pass_at_k: pass,
    completion_tokens_mean: 12.345,
  });
  const results: EvalResults[] = [
    { model: 'step_20', step: 20, environments: { arithmetic: env(0.75, { '1': 0.75, '2': 0.875 }) } },
    {
      model: 'base',
      step: null,
      environments: { 'reverse-text': env(0.05, null, 1), arithmetic: env(0.125, { '1': 0.125, '2': 0.2 }) },
    },
    { model: 'step_5', step: 5, environments: { 'reverse-text': env(0.5, null, 1) } },
  ];
  let tmp: string;
  beforeAll(() => (tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'eval-'))));
  afterAll(() => fs.rmSync(tmp, { recursive: true, force: true }));

  test('round trip, sorted base first then by step; odd model names make safe file names', () => {
    for (const r of results) writeEvalResults(tmp, r);
    expect(readEvalResults(tmp).map((r) => r.model)).toEqual(['base', 'step_5', 'step_20']);
    expect(readEvalResults(tmp)[0]).toEqual(results[1]);
    expect(path.basename(evalResultsFile(tmp, 'Qwen/Qwen3-0.6B'))).toBe('Qwen_Qwen3-0.6B.json');
    expect(readEvalResults(path.join(tmp, 'nowhere'))).toEqual([]);
  });

  test('a malformed results file is named', () => {
    const dir = fs.mkdtempSync(path.join(tmp, 'bad-'));
    fs.mkdirSync(path.join(dir, 'eval'));
    fs.writeFileSync(
      path.join(dir, 'eval', 'x.json'),
      JSON.stringify({ model: 'x', step: null, environments: { a: { avg_at_k: 1 } } }),
    );
    expect(() => readEvalResults(dir)).toThrow(
      /eval\/x\.json: not an eval results file: environments\.a\.num_examples: /,
    );
  });

  test('terminal table: one row per environment x model, aligned', () => {
    expect(renderEvalTable(readEvalResults(tmp))).toBe(
      [
        'environment   model    k  avg@k    std  pass@1  pass@2  tokens',
        '------------  -------  -  -----  -----  ------  ------  ------',
        'reverse-text  base     1  0.050  0.250       -       -    12.3',
        'reverse-text  step_5   1  0.500  0.250       -       -    12.3',
        'arithmetic    base     2  0.125  0.250   0.125   0.200    12.3',
        'arithmetic    step_20  2  0.750  0.250   0.750   0.875    12.3',
      ].join('\n'),
    );
    expect(renderEvalTable([])).toBe('(no eval results)');
  });
});
