/**
 * arithmetic: generated integer problems (`12 + 7 * 3`, usual precedence) with an exact answer.
 * Difficulty comes from the number of operands, the digits per operand and the operators.
 * Reward 1 when the first `<answer>` block states the right integer, else 0.
 */
import { z } from 'zod';
import { generatedDataset } from '../dataset';
import { defineEnvironment } from '../define';
import { extractTag, lastAssistantText } from '../parse';
import type { Dataset, RewardFunction } from '../types';
import { evaluate, OPERATORS, parseInteger, randomExpression } from './expression';

export const ARITHMETIC_SYSTEM_PROMPT =
  'Compute the value of the expression (multiplication before addition and subtraction). Put only the final integer in <answer> tags.';

/** 1 when the reply's first `<answer>` block is the integer `answer`, else 0. */
export function arithmeticReward(reply: string, answer: string): number {
  const stated = parseInteger(extractTag(reply, 'answer'));
  return stated !== undefined && stated === BigInt(answer) ? 1 : 0;
}

/** Problem shape args (shared with the calculator env, which has harder defaults). */
export function problemArgs(defaults: { operands: number; digits: number }) {
  return {
    min_operands: z.number().int().min(2).max(8).default(defaults.operands).describe('fewest operands per problem'),
    max_operands: z.number().int().min(2).max(8).default(defaults.operands).describe('most operands per problem'),
    digits: z.number().int().min(1).max(9).default(defaults.digits).describe('most digits per operand'),
    operators: z.array(z.enum(OPERATORS)).min(1).default(['+', '-', '*']).describe('operators to draw from'),
  };
}

export const operandsInOrder = (a: { min_operands: number; max_operands: number }) => a.min_operands <= a.max_operands;

type ProblemShape = z.infer<z.ZodObject<ReturnType<typeof problemArgs>>>;

/** The generated problems of an env with `problemArgs` (arithmetic, calculator), asked under `systemPrompt`. */
export function problemDataset(name: string, systemPrompt: string, a: ProblemShape): Dataset {
  const shape = { minOperands: a.min_operands, maxOperands: a.max_operands, digits: a.digits, operators: a.operators };
  return generatedDataset({
    name,
    key: (example) => String(example.info.expression),
    generate(rng) {
      const expression = randomExpression(rng, shape);
      return {
        prompt: [
          { role: 'system', content: systemPrompt },
          { role: 'user', content: expression },
        ],
        answer: evaluate(expression).toString(),
        info: { expression },
      };
    },
  });
}

/** The rubric term of a problem env: 1 for the exact answer in the last assistant turn. */
export const correctAnswer: RewardFunction = {
  name: 'correct',
  fn: ({ completion, example }) => arithmeticReward(lastAssistantText(completion), example.answer),
};

export default defineEnvironment({
  name: 'arithmetic',
  description: 'integer arithmetic problems; reward 1 for the exact answer in <answer> tags',
  args: z
    .strictObject(problemArgs({ operands: 2, digits: 2 }))
    .refine(operandsInOrder, { message: 'min_operands must be <= max_operands', path: ['min_operands'] }),
  create(a) {
    return {
      dataset: problemDataset('arithmetic', ARITHMETIC_SYSTEM_PROMPT, a),
      rubric: [
        correctAnswer,
        // Logged only: tells "never uses the tags" apart from "wrong number".
        {
          name: 'format',
          weight: 0,
          fn: ({ completion }) => (/<answer>[\s\S]*?<\/answer>/.test(lastAssistantText(completion)) ? 1 : 0),
        },
      ],
      demonstration: (example) => [{ role: 'assistant', content: `<answer>${example.answer}</answer>` }],
    };
  },
});
