/** The environment API: finding envs by id, args validation, defaults, rubric, tools, list datasets. */
import * as path from 'node:path';
import { z } from 'zod';
import { defineEnvironment, instantiate } from '../../lib/envs/define';
import { listDataset } from '../../lib/envs/dataset';
import { BUILTIN_ENV_IDS, loadEnvironment } from '../../lib/envs/loader';
import { parseToolCalls } from '../../lib/envs/tools';
import type { Example } from '../../lib/envs/types';

const FIXTURES = path.join(__dirname, '..', 'fixtures', 'envs');

describe('loadEnvironment', () => {
  test('built-ins', () => {
    expect(BUILTIN_ENV_IDS).toEqual(['reverse-text', 'arithmetic', 'guess-number', 'calculator']);
    expect(loadEnvironment('reverse-text').maxTurns).toBe(1);
    expect(loadEnvironment('guess-number').maxTurns).toBe(6);
  });

  test('a module path, relative to the working directory or absolute; `environment` export', async () => {
    const rel = './' + path.relative(process.cwd(), path.join(FIXTURES, 'named-export.ts'));
    const env = loadEnvironment(rel, { rounds: 3 });
    expect(env.name).toBe('colours');
    expect(env.maxTurns).toBe(3);
    expect(env.dataset.size('train')).toBe(4);
    expect(loadEnvironment(path.join(FIXTURES, 'named-export.ts')).maxTurns).toBe(2);
  });

  test('a plain JavaScript module exporting the definition as module.exports', async () => {
    const env = loadEnvironment(path.join(FIXTURES, 'plain.js'));
    expect(env.dataset.example('eval', 2, 0).prompt[0].content).toBe('eval 2');
    expect(
      await env.score({ example: env.dataset.example('train', 0, 0), messages: [], completion: [], state: {} }),
    ).toEqual({
      reward: 1,
      metrics: { one: 1 },
    });
  });

  test('unknown ids list the built-ins; modules without a definition say so', () => {
    expect(() => loadEnvironment('no-such-env-anywhere')).toThrow(
      'unknown environment "no-such-env-anywhere": not a built-in (reverse-text, arithmetic, guess-number, calculator), a module path (./file.ts) or an installed npm package',
    );
    expect(() => loadEnvironment('./missing/env.ts')).toThrow(
      /environment "\.\/missing\/env\.ts": module .*missing\/env\.ts not found/,
    );
    expect(() => loadEnvironment(path.join(FIXTURES, 'not-an-env.ts'))).toThrow(/exports no environment definition/);
    // An installed npm package that is not an environment.
    expect(() => loadEnvironment('smol-toml')).toThrow(
      /environment "smol-toml": the module exports no environment definition/,
    );
  });

  test('args are validated by the env schema: errors name the env id and the arg', () => {
    expect(() => loadEnvironment('guess-number', { max_turns: 'many' })).toThrow(
      /^environment "guess-number": invalid args: max_turns: .*number/,
    );
    expect(() => loadEnvironment('guess-number', { colour: 'red' })).toThrow(
      /environment "guess-number": invalid args: .*colour/,
    );
  });
});

describe('defineEnvironment defaults and checks', () => {
  const dataset = listDataset([{ prompt: [{ role: 'user', content: 'hi' }], answer: 'x', info: {} }], { evalSize: 0 });
  const base = { name: 't', args: z.strictObject({}) };

  test('single-turn by default: one turn, respond says done, empty state', async () => {
    const env = instantiate(
      defineEnvironment({ ...base, create: () => ({ dataset, rubric: [{ name: 'r', fn: () => 0.5 }] }) }),
      {},
      't',
    );
    expect(env.maxTurns).toBe(1);
    expect(env.tools).toEqual([]);
    const ex = env.dataset.example('train', 0, 0);
    expect(env.init(ex)).toEqual({});
    expect(await env.respond({ example: ex, messages: ex.prompt, state: {}, turn: 1 })).toEqual({ done: true });
  });

  test('weighted rubric: reward is the weighted sum, metrics are unweighted, weight 0 logs only', async () => {
    const env = instantiate(
      defineEnvironment({
        ...base,
        create: () => ({
          dataset,
          rubric: [
            { name: 'a', weight: 0.25, fn: () => 1 },
            { name: 'b', weight: 2, fn: async () => 0.5 },
            { name: 'logged', weight: 0, fn: () => 7 },
          ],
        }),
      }),
      {},
      't',
    );
    const ex = env.dataset.example('train', 0, 0);
    expect(await env.score({ example: ex, messages: ex.prompt, completion: [], state: {} })).toEqual({
      reward: 1.25,
      metrics: { a: 1, b: 0.5, logged: 7 },
    });
  });

  test('bad rubrics and bad reward values are errors', async () => {
    const make = (rubric: { name: string; fn: () => number }[]) =>
      instantiate(defineEnvironment({ ...base, create: () => ({ dataset, rubric }) }), {}, 'bad');
    expect(() => make([])).toThrow('environment "bad": the rubric needs at least one reward function');
    expect(() =>
      make([
        { name: 'x', fn: () => 1 },
        { name: 'x', fn: () => 1 },
      ]),
    ).toThrow(/"x" appears twice/);
    const nan = make([{ name: 'x', fn: () => NaN }]);
    const ex = nan.dataset.example('train', 0, 0);
    await expect(nan.score({ example: ex, messages: [], completion: [], state: {} })).rejects.toThrow(
      /"x" returned NaN/,
    );
  });
});

describe('parseToolCalls', () => {
  test('Qwen-style blocks, string arguments, and malformed calls', () => {
    expect(
      parseToolCalls(
        'text <tool_call>\n{"name": "f", "arguments": {"x": 1}}\n</tool_call> more <tool_call>{"name": "g", "arguments": "{\\"y\\": 2}"}</tool_call>',
      ),
    ).toEqual([
      { name: 'f', arguments: { x: 1 } },
      { name: 'g', arguments: { y: 2 } },
    ]);
    expect(parseToolCalls('<tool_call>{"name": "f"}</tool_call>')).toEqual([{ name: 'f', arguments: {} }]);
    expect(parseToolCalls('<tool_call>[1]</tool_call>')).toEqual([{ error: 'tool call needs a "name" string' }]);
    expect(parseToolCalls('<tool_call>{"name": "f", "arguments": [1]}</tool_call>')).toEqual([
      { error: 'arguments of "f" must be a JSON object' },
    ]);
    expect(parseToolCalls('<tool_call>{"name": "f", "arguments": "{"}</tool_call>')).toEqual([
      { error: 'arguments of "f" are not valid JSON' },
    ]);
    expect(parseToolCalls('no calls, <tool_call> unclosed')).toEqual([]);
  });
});

describe('listDataset', () => {
  const items: Example[] = Array.from({ length: 50 }, (_, i) => ({
    prompt: [{ role: 'user', content: `q${i}` }],
    answer: `${i}`,
    info: {},
  }));

  test('seeded split: disjoint, complete, deterministic, sized', () => {
    const ds = listDataset(items, { evalSize: 0.2 });
    expect(ds.size('train')).toBe(40);
    expect(ds.size('eval')).toBe(10);
    const take = (split: 'train' | 'eval', seed: number) =>
      Array.from({ length: ds.size(split)! }, (_, i) => ds.example(split, i, seed).answer);
    const train = take('train', 5);
    const evalSplit = take('eval', 5);
    expect([...train, ...evalSplit].sort()).toEqual(items.map((e) => e.answer).sort());
    expect(take('train', 5)).toEqual(train);
    expect(take('eval', 6)).not.toEqual(evalSplit);
    expect(() => ds.example('eval', 10, 5)).toThrow('example 10 is out of range: the eval split has 10');
  });

  test('impossible eval sizes are rejected', () => {
    expect(() => listDataset(items, { evalSize: 51 })).toThrow(/does not fit 50 examples/);
  });
});
