/**
 * guess-number: a multi-turn game. The env thinks of an integer; after each guess in `<guess>`
 * tags it answers "Higher." or "Lower." (or asks for a well-formed guess) until the model hits
 * the number or runs out of turns. Rewarded for success and for needing few turns.
 *
 * The rubric reads the transcript, not the rollout state: the driver does not call `respond`
 * after the last allowed turn, so a hit on that turn is only visible in the messages.
 */
import { z } from 'zod';
import { generatedDataset } from '../dataset';
import { defineEnvironment } from '../define';
import { extractTag, lastAssistantText } from '../parse';
import { uniformInt } from '../random';
import type { Message } from '../types';
import { parseInteger } from './expression';

export const GUESS_NUMBER_SYSTEM_PROMPT =
  'Guess the secret integer. Write each guess in <guess> tags. After a wrong guess you will be told whether the secret is higher or lower.';

function guessOf(text: string): bigint | undefined {
  return parseInteger(extractTag(text, 'guess'));
}

/** Outcome of a transcript: solved when the last guess hit the secret; turns = assistant turns. */
export function guessOutcome(completion: readonly Message[], secret: number): { solved: boolean; turns: number } {
  const turns = completion.filter((m) => m.role === 'assistant').length;
  return { solved: guessOf(lastAssistantText(completion)) === BigInt(secret), turns };
}

export default defineEnvironment({
  name: 'guess-number',
  description: 'multi-turn: guess a secret integer with higher/lower feedback',
  args: z
    .strictObject({
      min_value: z.number().int().default(1).describe('smallest secret'),
      max_value: z.number().int().default(20).describe('largest secret'),
      max_turns: z.number().int().positive().default(6).describe('guesses allowed'),
    })
    .refine((a) => a.min_value <= a.max_value, { message: 'min_value must be <= max_value', path: ['min_value'] }),
  create(a) {
    return {
      maxTurns: a.max_turns,
      // No `key`: a range of a few dozen secrets is too small to hold any out for eval.
      dataset: generatedDataset({
        name: 'guess-number',
        generate(rng) {
          const secret = uniformInt(rng, a.min_value, a.max_value);
          return {
            prompt: [
              { role: 'system', content: GUESS_NUMBER_SYSTEM_PROMPT },
              {
                role: 'user',
                content: `The secret is between ${a.min_value} and ${a.max_value}. You have ${a.max_turns} guesses. What is your first guess?`,
              },
            ],
            answer: String(secret),
            info: { secret },
          };
        },
      }),
      respond({ example, messages }) {
        const secret = BigInt(example.answer);
        const guess = guessOf(lastAssistantText(messages));
        if (guess === secret) return { done: true };
        const feedback =
          guess === undefined ? 'Write one integer guess in <guess> tags.' : guess < secret ? 'Higher.' : 'Lower.';
        return { messages: [{ role: 'user', content: feedback }], done: false };
      },
      rubric: [
        {
          name: 'solved',
          weight: 0.8,
          fn: ({ completion, example }) => (guessOutcome(completion, Number(example.answer)).solved ? 1 : 0),
        },
        {
          // 1 for a first-guess hit, falling linearly with each extra turn; 0 when unsolved.
          name: 'efficiency',
          weight: 0.2,
          fn: ({ completion, example }) => {
            const { solved, turns } = guessOutcome(completion, Number(example.answer));
            return solved ? 1 - (turns - 1) / a.max_turns : 0;
          },
        },
        { name: 'turns', weight: 0, fn: ({ completion }) => guessOutcome(completion, 0).turns },
      ],
    };
  },
});
