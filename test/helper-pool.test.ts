/**
 * The helper-process pool (lib/helper-pool.ts) against real forked processes: time and heap limits,
 * kill-and-replace, a dead helper failing its own task alone, queued tasks going to the next helper,
 * warm and lazy starts, a broken install refused by name. The env pool and the prompt helpers are
 * built on it (their own tests: envs.pool, inference.hardening).
 */
import * as path from 'node:path';
import { HelperPool, type HelperOutcome, type HelperPoolOptions } from '../lib/helper-pool';
import { moduleExecArgv } from '../lib/thread';
import type { HelperTask } from './fixtures/helper';
import { isRunning } from './support/processes';

const MODULE = path.join(__dirname, 'fixtures', 'helper.ts');
type Echoed = { value: unknown; pid: number };

const pools: HelperPool<HelperTask, Echoed>[] = [];
function pool(options: Partial<HelperPoolOptions> = {}): HelperPool<HelperTask, Echoed> {
  const p = new HelperPool<HelperTask, Echoed>({
    names: { pool: 'test pool', helper: 'test helper' },
    module: MODULE,
    execArgv: moduleExecArgv(MODULE),
    processes: 2,
    timeoutMs: 2000,
    start: 'warm',
    output: 'inherit',
    ...options,
  });
  pools.push(p);
  return p;
}
afterAll(() => Promise.all(pools.map((p) => p.close())));

const echo = (value: unknown): HelperTask => ({ do: 'echo', value });
/** The pid of the helper that answered, failing the test on any other outcome. */
const pidOf = (o: HelperOutcome<Echoed>) => {
  if (!o.ok) throw new Error(`expected an answer, got ${JSON.stringify(o)}`);
  return o.value.pid;
};

test('tasks run in helpers, one at a time each; a task that throws fails alone and its helper lives on', async () => {
  const p = pool();
  const answers = await Promise.all(Array.from({ length: 6 }, (_, i) => p.run(echo(i))));
  expect(answers.map((a) => a.ok && a.value.value)).toEqual([0, 1, 2, 3, 4, 5]);
  const pids = new Set(answers.map(pidOf));
  expect(pids.size).toBeLessThanOrEqual(2);
  expect(pids.has(process.pid)).toBe(false);
  const thrown = await p.run({ do: 'throw' });
  expect(thrown).toMatchObject({ ok: false, kind: 'error', error: 'deliberate failure' });
  expect((thrown as { stack?: string }).stack).toMatch(/helper\.ts/);
  // Same helpers: nothing was replaced.
  expect((await p.run(echo('after'))).ok).toBe(true);
  for (const pid of pids) expect(isRunning(pid)).toBe(true);
  expect(p.stats.restarts).toBe(0);
});

test.each([
  ['hang', { ok: false, kind: 'timeout' }],
  ['crash', { ok: false, kind: 'died', exit: { code: null, signal: 'SIGSEGV' } }],
] as const)(
  'a task that does "%s" fails alone: its helper is killed and replaced, the tasks beside and after it run',
  async (what, outcome) => {
    const p = pool({ processes: 2 });
    const [bad, ...good] = await Promise.all([
      p.run({ do: what }),
      ...Array.from({ length: 4 }, (_, i) => p.run(echo(i))),
    ]);
    expect(bad).toMatchObject(outcome);
    expect(good.every((g) => g.ok)).toBe(true);
    const after = await Promise.all(Array.from({ length: 4 }, (_, i) => p.run(echo(i))));
    expect(after.every((a) => a.ok)).toBe(true);
    expect(p.stats.restarts).toBe(1);
  },
);

test('a helper that dies hands its queued tasks on: with one helper, the tasks behind a dead one run on its replacement', async () => {
  const p = pool({ processes: 1 });
  const [died, ...rest] = await Promise.all([p.run({ do: 'exit', code: 3 }), p.run(echo(1)), p.run(echo(2))]);
  expect(died).toMatchObject({ ok: false, kind: 'died', exit: { code: 3, signal: null } });
  expect(rest.map((r) => r.ok && r.value.value)).toEqual([1, 2]);
});

test('the heap limit: a task that outgrows it ends "died" with the heap report in the kept stderr; the pool serves on', async () => {
  const p = pool({ processes: 1, heapMb: 64, timeoutMs: 60_000, output: 'tail' });
  const hog = await p.run({ do: 'hog' });
  expect(hog).toMatchObject({ ok: false, kind: 'died' });
  expect((hog as { stderr: string }).stderr).toMatch(/heap limit|heap out of memory/i);
  expect((await p.run(echo('after'))).ok).toBe(true);
});

test('lazy: no helper runs before a task needs one, and never more than `processes`', async () => {
  const p = pool({ processes: 2, start: 'lazy' });
  const first = pidOf(await p.run(echo(0)));
  // One task at a time: the one helper started serves them all.
  for (let i = 1; i < 4; i++) expect(pidOf(await p.run(echo(i)))).toBe(first);
  const many = await Promise.all(Array.from({ length: 8 }, (_, i) => p.run(echo(i))));
  expect(new Set(many.map(pidOf)).size).toBeLessThanOrEqual(2);
  // A dead helper is replaced when the next task comes.
  expect(await p.run({ do: 'crash' })).toMatchObject({ kind: 'died' });
  expect((await p.run(echo('next'))).ok).toBe(true);
});

test('helpers that die before they are ready, three in a row, are a broken install: every task is refused by name', async () => {
  for (const start of ['warm', 'lazy'] as const) {
    const p = pool({ processes: 1, args: ['die-at-start'], start });
    const message = 'test pool: 3 test helpers in a row died before starting (last: exit code 7)';
    await expect(p.run(echo(1))).rejects.toThrow(message);
    await expect(p.run(echo(2))).rejects.toThrow(message);
  }
});

test('closing rejects the tasks queued and running, then every new one; its helpers exit', async () => {
  const p = pool({ processes: 1, timeoutMs: 60_000 });
  const pid = pidOf(await p.run(echo(0)));
  const running = expect(p.run({ do: 'hang' })).rejects.toThrow('test pool closed');
  const queued = expect(p.run(echo(1))).rejects.toThrow('test pool closed');
  await p.close();
  await running;
  await queued;
  await expect(p.run(echo(2))).rejects.toThrow('test pool closed');
  expect(isRunning(pid)).toBe(false);
});
