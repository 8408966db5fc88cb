/**
 * workflows/inbox.ts: completions come out in the order their promises resolved, whatever was added
 * first and however deep the chains that resolve them, and a failure is thrown in its turn.
 */
import { Inbox } from '../../workflows/inbox';

function deferred<T>() {
  let resolve!: (v: T) => void;
  let reject!: (e: unknown) => void;
  const promise = new Promise<T>((res, rej) => ((resolve = res), (reject = rej)));
  return { promise, resolve, reject };
}

test('completions resolved together come out in resolution order, not in the order they were added', async () => {
  const inbox = new Inbox<string>();
  const [a, b, c] = [deferred<string>(), deferred<string>(), deferred<string>()];
  inbox.add(a.promise);
  inbox.add(b.promise);
  inbox.add(c.promise);
  // As a workflow activation resolves several activities: synchronously, in job order.
  c.resolve('c');
  a.resolve('a');
  b.resolve('b');
  expect(inbox.size).toBe(3);
  // A taker that does more work between takes still gets them in that order.
  const taken: string[] = [];
  for (let i = 0; i < 3; i++) {
    taken.push(await inbox.next());
    await Promise.resolve();
  }
  expect(taken).toEqual(['c', 'a', 'b']);
  expect(inbox.size).toBe(0);
  await expect(inbox.next()).rejects.toThrow('no work in flight');
});

test('a taker waiting before anything resolves gets the first resolution; a failure is thrown in its turn', async () => {
  const inbox = new Inbox<number>();
  const [a, b] = [deferred<number>(), deferred<number>()];
  inbox.add(a.promise);
  inbox.add(b.promise);
  const first = inbox.next();
  b.reject(new Error('b failed for good'));
  a.resolve(1);
  await expect(first).rejects.toThrow('b failed for good');
  expect(await inbox.next()).toBe(1);
});
