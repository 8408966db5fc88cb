/**
 * reverse-text: reverse a short English text character by character. The reward is Python's
 * `difflib.SequenceMatcher(None, parsed, answer).ratio()`, as in prime-rl's reverse-text example,
 * so partial reversals earn partial credit.
 */
import { z } from 'zod';
import { generatedDataset } from '../dataset';
import { defineEnvironment } from '../define';
import { sequenceRatio } from '../difflib';
import { extractTag, lastAssistantText } from '../parse';
import { uniformInt, type Rng } from '../random';

export const REVERSE_TEXT_SYSTEM_PROMPT =
  'Reverse the text character-by-character. Put your answer in <reversed_text> tags.';

/** Reverses by Unicode code point (Python's `text[::-1]`), so astral characters stay whole. */
export function reverseText(text: string): string {
  return Array.from(text).reverse().join('');
}

/** The graded answer: the first `<reversed_text>` block of the reply, stripped; '' if none. */
export function parseReversed(reply: string): string {
  return extractTag(reply, 'reversed_text');
}

export function reverseTextReward(reply: string, answer: string): number {
  return sequenceRatio(parseReversed(reply), answer);
}

const args = z
  .strictObject({
    min_words: z.number().int().positive().default(1).describe('fewest words per text'),
    max_words: z.number().int().positive().default(3).describe('most words per text'),
    min_chars: z.number().int().positive().default(1).describe('shortest text in characters'),
    max_chars: z
      .number()
      .int()
      .positive()
      .default(20)
      .describe('longest text in characters (defaults suit tiny models)'),
  })
  .refine((a) => a.min_words <= a.max_words, { message: 'min_words must be <= max_words', path: ['min_words'] })
  .refine((a) => a.min_chars <= a.max_chars, { message: 'min_chars must be <= max_chars', path: ['min_chars'] });

/** Redraws of a text whose length is out of bounds before the args are declared infeasible. */
const MAX_DRAWS = 10_000;

// The word list is 275k strings: load it once per process, and only when the env is used.
let words: readonly string[] | undefined;
function englishWords(): readonly string[] {
  words ??= require('an-array-of-english-words') as string[];
  return words;
}

export default defineEnvironment({
  name: 'reverse-text',
  description: 'reverse short English texts; reward = difflib ratio to the reversed text',
  args,
  create(a) {
    // Words that could ever fit; the length bound is then enforced per text by redrawing.
    const vocab = englishWords().filter((w) => w.length <= a.max_chars);
    if (vocab.length === 0) throw new Error(`reverse-text: no word is at most ${a.max_chars} characters`);
    const drawText = (rng: Rng): string => {
      for (let draw = 0; draw < MAX_DRAWS; draw++) {
        const n = uniformInt(rng, a.min_words, a.max_words);
        const parts: string[] = [];
        for (let i = 0; i < n; i++) parts.push(vocab[uniformInt(rng, 0, vocab.length - 1)]);
        const text = parts.join(' ');
        if (text.length >= a.min_chars && text.length <= a.max_chars) return text;
      }
      throw new Error(
        `reverse-text: no text of ${a.min_words}-${a.max_words} words has ${a.min_chars}-${a.max_chars} characters`,
      );
    };
    return {
      dataset: generatedDataset({
        name: 'reverse-text',
        key: (example) => String(example.info.text),
        generate(rng) {
          const text = drawText(rng);
          return {
            prompt: [
              { role: 'system', content: REVERSE_TEXT_SYSTEM_PROMPT },
              { role: 'user', content: text },
            ],
            answer: reverseText(text),
            info: { text },
          };
        },
      }),
      rubric: [
        {
          name: 'lcs_ratio',
          fn: ({ completion, example }) => reverseTextReward(lastAssistantText(completion), example.answer),
        },
      ],
      demonstration: (example) => [
        { role: 'assistant', content: `<reversed_text>\n${example.answer}\n</reversed_text>` },
      ],
    };
  },
});
