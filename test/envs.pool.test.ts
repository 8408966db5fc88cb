/**
 * The env worker pool against real child processes: failures of one call (throw, hang, busy loop,
 * crash, exit) are reported as errored results and the pool keeps serving.
 */
import * as path from 'node:path';
import { EnvPool } from '../lib/envs/pool';
import { loadEnvironment } from '../lib/envs/loader';
import type { Example } from '../lib/envs/types';

const FAULTY = path.join(__dirname, 'fixtures', 'envs', 'faulty.ts');
const faulty = (mode: string, op = 'example') => ({ id: FAULTY, args: { mode, op } });
const healthy = { id: FAULTY, args: { mode: 'ok' } };

describe('EnvPool', () => {
  let pool: EnvPool;
  beforeAll(() => {
    pool = new EnvPool({ workers: 2, timeoutS: 3 });
  });
  afterAll(() => pool.close());

  test('runs built-in envs in workers: same examples and scores as in-process', async () => {
    const spec = { id: 'reverse-text', args: { max_words: 2 } };
    const local = loadEnvironment(spec.id, spec.args);
    const info = await pool.info(spec);
    expect(info).toEqual({
      ok: true,
      value: { name: 'reverse-text', maxTurns: 1, tools: [], size: { train: null, eval: null } },
    });
    const ex = await pool.example(spec, 'train', 5, 42);
    expect(ex).toEqual({ ok: true, value: local.dataset.example('train', 5, 42) });
    const example = (ex as { value: Example }).value;
    const completion = [{ role: 'assistant', content: `<reversed_text>${example.answer}</reversed_text>` }];
    const s = await pool.score(spec, { example, messages: [...example.prompt, ...completion], completion, state: {} });
    expect(s).toEqual({ ok: true, value: { reward: 1, metrics: { lcs_ratio: 1 } } });
  });

  test('multi-turn calls: init and respond round-trip the state', async () => {
    const spec = { id: 'guess-number' };
    const ex = await pool.example(spec, 'eval', 0, 0);
    if (!ex.ok) throw new Error(ex.error);
    const state = await pool.init(spec, ex.value);
    expect(state).toEqual({ ok: true, value: {} });
    const messages = [...ex.value.prompt, { role: 'assistant', content: '<guess>-1</guess>' }];
    expect(await pool.respond(spec, { example: ex.value, messages, state: {}, turn: 1 })).toEqual({
      ok: true,
      value: { messages: [{ role: 'user', content: 'Higher.' }], done: false },
    });
  });

  test('bad args are an errored call naming the env', async () => {
    const r = await pool.info({ id: 'arithmetic', args: { digits: 'many' } });
    expect(r).toMatchObject({
      ok: false,
      kind: 'error',
      error: expect.stringMatching(
        /environment "arithmetic" info failed: environment "arithmetic": invalid args: digits/,
      ),
    });
  });

  test.each([
    ['throw', 'error', /failed: deliberate failure/],
    ['hang', 'timeout', /timed out after 3s/],
    ['crash', 'crash', /env worker died \(signal SIGSEGV\)/],
    ['exit', 'crash', /env worker died \(exit code 3\)/],
  ])('an env that does "%s" errors that call only; the next calls still work', async (mode, kind, message) => {
    const before = pool.stats;
    const [bad, ...good] = await Promise.all([
      pool.example(faulty(mode), 'train', 0, 0),
      ...Array.from({ length: 4 }, (_, i) => pool.example(healthy, 'train', i, 0)),
    ]);
    expect(bad).toMatchObject({ ok: false, kind, error: expect.stringMatching(message) });
    expect(good.every((r) => r.ok)).toBe(true);
    // And afterwards, with a replaced worker where one died.
    const after = await Promise.all(Array.from({ length: 4 }, (_, i) => pool.example(healthy, 'eval', i, 0)));
    expect(after.every((r) => r.ok)).toBe(true);
    const stats = pool.stats;
    expect(stats.calls - before.calls).toBe(9);
    expect(stats.errors - before.errors).toBe(kind === 'error' ? 1 : 0);
    expect(stats.timeouts - before.timeouts).toBe(kind === 'timeout' ? 1 : 0);
    expect(stats.crashes - before.crashes).toBe(kind === 'crash' ? 1 : 0);
    expect(stats.restarts - before.restarts).toBe(kind === 'error' ? 0 : 1);
  });

  test('a score that never settles times out; scoring goes on', async () => {
    const ex = await pool.example(faulty('hang-async', 'score'), 'train', 0, 0);
    if (!ex.ok) throw new Error(ex.error);
    const ctx = { example: ex.value, messages: ex.value.prompt, completion: [], state: {} };
    const [hung, fine] = await Promise.all([pool.score(faulty('hang-async', 'score'), ctx), pool.score(healthy, ctx)]);
    expect(hung).toMatchObject({
      ok: false,
      kind: 'timeout',
      error: 'environment "' + FAULTY + '" score timed out after 3s',
    });
    expect(fine).toEqual({ ok: true, value: { reward: 0, metrics: { echo: 0 } } });
  });

  test('closing rejects new calls', async () => {
    const p = new EnvPool({ workers: 1, timeoutS: 5 });
    expect((await p.example(healthy, 'train', 0, 0)).ok).toBe(true);
    await p.close();
    await expect(p.example(healthy, 'train', 0, 0)).rejects.toThrow('env pool closed');
  });
});
