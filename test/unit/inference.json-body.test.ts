/**
 * Large response bodies are written in pieces, without holding the event loop (json-body.ts): a
 * completion of millions of logprob entries used to block `/health` for seconds while its body was
 * built and serialised.
 */
import { jsonPieces, LazyArray, mapInSlices } from '../../lib/inference/server/json-body';

/** A body shaped like a chat completion with 20 top logprobs per token, `tokens` tokens per choice. */
function body(choices: number, tokens: number) {
  const entry = (i: number) => ({
    token: `t${i}`,
    logprob: -i / 7,
    bytes: [116, 48 + (i % 10)],
    top_logprobs: Array.from({ length: 20 }, (_, j) => ({ token: `a${j}`, logprob: -j, bytes: [97] })),
  });
  return {
    id: 'x',
    nothing: undefined,
    choices: Array.from({ length: choices }, (_, index) => ({
      index,
      message: { role: 'assistant', content: 'é"\n\u2028', tool_calls: undefined },
      logprobs: { content: new LazyArray(tokens, entry) },
      token_ids: Array.from({ length: tokens }, (_, i) => i),
      missing: [undefined, null, 1],
    })),
    empty: [],
    usage: { prompt_tokens: 3, completion_tokens: choices * tokens },
  };
}

test('the pieces are JSON.stringify of the body, LazyArrays included', async () => {
  for (const [choices, tokens] of [
    [1, 0],
    [2, 3],
    [3, 10_000],
  ]) {
    const b = body(choices, tokens);
    let text = '';
    for await (const piece of jsonPieces(b)) text += piece;
    expect(text).toBe(JSON.stringify(b));
  }
  for (const v of [null, 1, 'x', [], {}, [1, 'a', null], { a: [{ b: new LazyArray(2, (i) => [i]) }] }]) {
    let text = '';
    for await (const piece of jsonPieces(v)) text += piece;
    expect(text).toBe(JSON.stringify(v));
  }
});

/**
 * `work`'s result, and how many turns the event loop took while it ran: were it done in one go, no
 * immediate could run before it is done (1 turn at most).
 */
async function turnsDuring<T>(work: () => Promise<T>): Promise<{ result: T; turns: number }> {
  let turns = 0;
  let running = true;
  const count = () => {
    turns++;
    if (running) setImmediate(count);
  };
  setImmediate(count);
  const result = await work().finally(() => (running = false));
  return { result, turns };
}

test('writing a body of millions of entries gives the event loop back while it runs', async () => {
  const b = body(8, 20_000); // 8 x 20,000 x 21 = 3.4 M entries
  const { result: pieces, turns } = await turnsDuring(async () => {
    let n = 0;
    for await (const _ of jsonPieces(b)) n++;
    return n;
  });
  expect(pieces).toBeGreaterThan(1);
  expect(turns).toBeGreaterThan(1);
});

test('mapInSlices is Array.from, giving the event loop back while it runs', async () => {
  const { result, turns } = await turnsDuring(() => mapInSlices(300_000, (i) => `${i}`.padStart(8, '0')));
  expect(result).toEqual(Array.from({ length: 300_000 }, (_, i) => `${i}`.padStart(8, '0')));
  expect(turns).toBeGreaterThan(1);
});
