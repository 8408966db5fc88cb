/** The built-in environments: rewards on hand-computed cases, parsing edge cases, datasets. */
import { loadEnvironment } from '../../lib/envs/loader';
import { arithmeticReward } from '../../lib/envs/builtin/arithmetic';
import { evaluate, parseInteger } from '../../lib/envs/builtin/expression';
import {
  parseReversed,
  reverseText,
  reverseTextReward,
  REVERSE_TEXT_SYSTEM_PROMPT,
} from '../../lib/envs/builtin/reverse-text';
import type { Environment, Example, JsonObject, Message, Split } from '../../lib/envs/types';

const assistant = (content: string): Message => ({ role: 'assistant', content });

function score(env: Environment, example: Example, completion: Message[], state: JsonObject = {}) {
  return env.score({ example, messages: [...example.prompt, ...completion], completion, state });
}

function examples(env: Environment, split: Split, n: number, seed = 0): Example[] {
  return Array.from({ length: n }, (_, i) => env.dataset.example(split, i, seed));
}

describe('reverse-text', () => {
  const env = loadEnvironment('reverse-text');

  test('parsing: first block, across lines, Python-stripped, empty when absent', () => {
    expect(parseReversed('<reversed_text> olleh </reversed_text>')).toBe('olleh');
    expect(parseReversed('a <reversed_text>one</reversed_text> <reversed_text>two</reversed_text>')).toBe('one');
    expect(parseReversed('<reversed_text>\nab\ncd\n</reversed_text>')).toBe('ab\ncd');
    expect(parseReversed('olleh')).toBe('');
    expect(parseReversed('<reversed_text>unclosed')).toBe('');
    expect(parseReversed('<reversed_text></reversed_text>')).toBe('');
    // \x1c is whitespace to Python's strip() but not to JS trim(); U+FEFF the other way round.
    expect(parseReversed('<reversed_text>\x1cab\ufeff</reversed_text>')).toBe('ab\ufeff');
  });

  test('reverses by code point', () => {
    expect(reverseText('abc def')).toBe('fed cba');
    expect(reverseText('a😀b')).toBe('b😀a');
  });

  test('reward = difflib ratio of the parsed answer', () => {
    expect(reverseTextReward('<reversed_text>olleh</reversed_text>', 'olleh')).toBe(1);
    expect(reverseTextReward('<reversed_text>olle</reversed_text>', 'olleh')).toBe((2 * 4) / 9);
    expect(reverseTextReward('<reversed_text>hello</reversed_text>', 'olleh')).toBe(0.4); // the longest match is 'll': 2*2/10
    expect(reverseTextReward('olleh', 'olleh')).toBe(0); // no tags: '' vs answer
  });

  test('examples: system prompt, short English texts, answer is the reversal', () => {
    for (const ex of examples(env, 'train', 200)) {
      expect(ex.prompt[0]).toEqual({ role: 'system', content: REVERSE_TEXT_SYSTEM_PROMPT });
      const text = ex.prompt[1].content as string;
      expect(text.split(' ').length).toBeGreaterThanOrEqual(1);
      expect(text.split(' ').length).toBeLessThanOrEqual(3);
      expect(text.length).toBeLessThanOrEqual(20);
      expect(text).toMatch(/^[a-z]+( [a-z]+)*$/);
      expect(ex.answer).toBe(reverseText(text));
    }
  });

  test('scoring through the rubric logs the metric by name', async () => {
    const ex = env.dataset.example('train', 0, 0);
    await expect(score(env, ex, [assistant(`<reversed_text>${ex.answer}</reversed_text>`)])).resolves.toEqual({
      reward: 1,
      metrics: { lcs_ratio: 1 },
    });
  });

  test('length args are honoured and validated', () => {
    const long = loadEnvironment('reverse-text', { min_words: 4, max_words: 6, max_chars: 80, min_chars: 30 });
    for (const ex of examples(long, 'eval', 50)) {
      const text = ex.prompt[1].content as string;
      expect(text.length).toBeGreaterThanOrEqual(30);
      expect(text.length).toBeLessThanOrEqual(80);
      expect(text.split(' ').length).toBeGreaterThanOrEqual(4);
    }
    expect(() => loadEnvironment('reverse-text', { min_words: 3, max_words: 2 })).toThrow(/reverse-text.*min_words/);
    expect(() => loadEnvironment('reverse-text', { max_char: 5 })).toThrow(/reverse-text.*max_char/);
  });

  test('infeasible length bounds fail with a clear error instead of looping', () => {
    const env2 = loadEnvironment('reverse-text', { max_words: 1, min_chars: 40, max_chars: 60 });
    expect(() => env2.dataset.example('train', 0, 0)).toThrow(/no text of 1-1 words has 40-60 characters/);
  });
});

describe('arithmetic', () => {
  test('evaluator: precedence, unary minus, parentheses, exact big products', () => {
    expect(evaluate('2 + 3 * 4')).toBe(14n);
    expect(evaluate('3 - 12')).toBe(-9n);
    expect(evaluate('-(2 + 3) * -4')).toBe(20n);
    expect(evaluate('999999999 * 999999999 * 999999999')).toBe(999999997000000002999999999n);
    expect(() => evaluate('2 / 3')).toThrow(/unexpected "\/"/);
    expect(() => evaluate('2 +')).toThrow(/end of expression/);
    expect(() => evaluate('(2')).toThrow(/missing \)/);
    expect(() => evaluate('1'.repeat(201))).toThrow(/longer than 200/);
  });

  test('integer parsing of answers', () => {
    expect(parseInteger(' -12 ')).toBe(-12n);
    expect(parseInteger('+7')).toBe(7n);
    expect(parseInteger('1,024')).toBe(1024n);
    expect(parseInteger('12.0')).toBeUndefined();
    expect(parseInteger('twelve')).toBeUndefined();
    expect(parseInteger('')).toBeUndefined();
  });

  test('reward 1 only for the exact integer in the first <answer> block', () => {
    expect(arithmeticReward('<answer>14</answer>', '14')).toBe(1);
    expect(arithmeticReward('so <answer> 14 </answer>', '14')).toBe(1);
    expect(arithmeticReward('<answer>-9</answer>', '-9')).toBe(1);
    expect(arithmeticReward('<answer>15</answer><answer>14</answer>', '14')).toBe(0);
    expect(arithmeticReward('14', '14')).toBe(0);
    expect(arithmeticReward('<answer>14 apples</answer>', '14')).toBe(0);
  });

  test('examples follow the args; answers are right; format is a logged-only metric', async () => {
    const env = loadEnvironment('arithmetic', { min_operands: 3, max_operands: 4, digits: 3, operators: ['*'] });
    for (const ex of examples(env, 'train', 100)) {
      const expr = String(ex.info.expression);
      const operands = expr.split(' * ');
      expect(operands.length).toBeGreaterThanOrEqual(3);
      expect(operands.length).toBeLessThanOrEqual(4);
      for (const o of operands) expect(o).toMatch(/^(0|[1-9]\d{0,2})$/);
      expect(ex.answer).toBe(operands.reduce((p, o) => p * BigInt(o), 1n).toString());
    }
    const ex = env.dataset.example('eval', 3, 1);
    expect(await score(env, ex, [assistant(`<answer>${ex.answer}</answer>`)])).toEqual({
      reward: 1,
      metrics: { correct: 1, format: 1 },
    });
    expect(await score(env, ex, [assistant('<answer>nope</answer>')])).toEqual({
      reward: 0,
      metrics: { correct: 0, format: 1 },
    });
  });

  test('bad args name the env and the arg', () => {
    expect(() => loadEnvironment('arithmetic', { operators: ['/'] })).toThrow(
      /environment "arithmetic": invalid args: operators\.0/,
    );
    expect(() => loadEnvironment('arithmetic', { digits: 0 })).toThrow(/"arithmetic".*digits/);
  });
});

describe('guess-number (multi-turn)', () => {
  const env = loadEnvironment('guess-number', { min_value: 1, max_value: 20, max_turns: 6 });
  const ex: Example = env.dataset.example('train', 0, 0);
  const secret = Number(ex.answer);

  async function play(guesses: string[]) {
    const messages: Message[] = [...ex.prompt];
    let state = env.init(ex);
    for (let turn = 1; turn <= guesses.length; turn++) {
      messages.push(assistant(guesses[turn - 1]));
      if (turn === env.maxTurns) break;
      const r = await env.respond({ example: ex, messages, state, turn });
      state = r.state ?? state;
      if (r.done) break;
      messages.push(...(r.messages ?? []));
    }
    return messages;
  }

  test('feedback says higher / lower / ask again, and a hit ends the game', async () => {
    const low = secret - 1;
    const high = secret + 1;
    const messages = await play([
      `<guess>${low}</guess>`,
      'maybe 7?',
      `<guess>${high}</guess>`,
      `<guess>${secret}</guess>`,
      '<guess>1</guess>',
    ]);
    const feedback = messages
      .filter((m) => m.role === 'user')
      .slice(1)
      .map((m) => m.content);
    expect(feedback).toEqual(['Higher.', 'Write one integer guess in <guess> tags.', 'Lower.']);
    // The hit on turn 4 ended the rollout: the fifth guess was never appended.
    expect(messages.filter((m) => m.role === 'assistant')).toHaveLength(4);
  });

  test('reward by success and turns used', async () => {
    const completion = (await play(['<guess>0</guess>', `<guess>${secret}</guess>`])).slice(ex.prompt.length);
    const s = await score(env, ex, completion);
    expect(s.metrics).toEqual({ solved: 1, efficiency: 1 - 1 / 6, turns: 2 });
    expect(s.reward).toBeCloseTo(0.8 + 0.2 * (5 / 6), 12);
    const first = await score(env, ex, [assistant(`<guess>${secret}</guess>`)]);
    expect(first.reward).toBe(1);
    const miss = await score(env, ex, [assistant('<guess>0</guess>')]);
    expect(miss).toEqual({ reward: 0, metrics: { solved: 0, efficiency: 0, turns: 1 } });
  });

  test('a hit on the last allowed turn counts although respond is never called for it', async () => {
    const guesses = [...Array(5).fill('<guess>-5</guess>'), `<guess>${secret}</guess>`];
    const completion = (await play(guesses)).slice(ex.prompt.length);
    expect(completion.filter((m) => m.role === 'assistant')).toHaveLength(6);
    expect((await score(env, ex, completion)).metrics.solved).toBe(1);
  });

  test('secrets lie in the range', () => {
    for (const e of examples(env, 'train', 100)) {
      expect(Number(e.answer)).toBeGreaterThanOrEqual(1);
      expect(Number(e.answer)).toBeLessThanOrEqual(20);
    }
  });
});

describe('calculator (tool calls)', () => {
  const env = loadEnvironment('calculator');
  const ex = env.dataset.example('train', 0, 0);
  const call = (expression: string) =>
    `<tool_call>\n{"name": "calculate", "arguments": {"expression": "${expression}"}}\n</tool_call>`;

  test('the tool is advertised with its JSON schema', () => {
    expect(env.maxTurns).toBe(4);
    expect(env.tools).toEqual([
      {
        type: 'function',
        function: {
          name: 'calculate',
          description: 'Evaluate an integer expression with + - * and parentheses.',
          parameters: expect.objectContaining({
            type: 'object',
            properties: { expression: expect.objectContaining({ type: 'string' }) },
            required: ['expression'],
          }),
        },
      },
    ]);
  });

  test('tool calls are run and answered with tool messages; a turn without calls ends the rollout', async () => {
    const messages: Message[] = [...ex.prompt, assistant(`Let me compute. ${call(String(ex.info.expression))}`)];
    const r1 = await env.respond({ example: ex, messages, state: {}, turn: 1 });
    expect(r1).toEqual({ done: false, messages: [{ role: 'tool', name: 'calculate', content: ex.answer }] });
    messages.push(...r1.messages!, assistant(`<answer>${ex.answer}</answer>`));
    const r2 = await env.respond({ example: ex, messages, state: {}, turn: 2 });
    expect(r2).toEqual({ done: true });
    const completion = messages.slice(ex.prompt.length);
    expect(await score(env, ex, completion)).toEqual({ reward: 1, metrics: { correct: 1, tool_calls: 1 } });
  });

  test('bad calls are reported to the model, not thrown', async () => {
    const messages: Message[] = [
      ...ex.prompt,
      assistant(
        `${call('2 / 0')}<tool_call>{"name": "sqrt", "arguments": {}}</tool_call><tool_call>{oops}</tool_call>${call('')}`,
      ),
    ];
    const r = await env.respond({ example: ex, messages, state: {}, turn: 1 });
    expect(r.done).toBe(false);
    expect(r.messages!.map((m) => m.content)).toEqual([
      'error: unexpected "/"',
      'error: unknown tool "sqrt"; available: calculate',
      'error: tool call is not valid JSON',
      'error: unexpected end of expression',
    ]);
  });
});

describe('datasets', () => {
  test.each([
    ['reverse-text', {}],
    ['arithmetic', {}],
    ['arithmetic', { digits: 1 }], // a space of only 300 problems
    ['calculator', {}],
    ['guess-number', {}],
  ])('%s %j: example i of a split is a pure function of (seed, split, i)', (id, args) => {
    const a = loadEnvironment(id, args);
    const b = loadEnvironment(id, args);
    expect(examples(a, 'train', 30, 7)).toEqual(examples(b, 'train', 30, 7));
    expect(a.dataset.example('eval', 12, 7)).toEqual(examples(b, 'eval', 13, 7)[12]);
    expect(examples(a, 'train', 30, 7)).not.toEqual(examples(a, 'train', 30, 8));
  });

  test.each([
    ['reverse-text', {}, 'text'],
    ['arithmetic', {}, 'expression'],
    ['arithmetic', { digits: 1 }, 'expression'],
    ['calculator', {}, 'expression'],
  ])('%s %j: train and eval splits are disjoint', (id, args, key) => {
    const env = loadEnvironment(id, args);
    const train = new Set(examples(env, 'train', 1000, 3).map((e) => e.info[key]));
    const evalKeys = examples(env, 'eval', 200, 3).map((e) => e.info[key]);
    expect(evalKeys.filter((k) => train.has(k))).toEqual([]);
    expect(new Set(evalKeys).size).toBeGreaterThan(1);
  });
});
