/**
 * calculator: arithmetic problems with a `calculate` tool. The model may call the tool (Qwen-style
 * `<tool_call>` JSON) any number of turns; results come back as `tool` messages, and the first
 * turn without a tool call is its final answer. Reward 1 for the exact integer in `<answer>` tags.
 */
import { z } from 'zod';
import { generatedDataset } from '../dataset';
import { defineEnvironment } from '../define';
import { lastAssistantText } from '../parse';
import { defineTool } from '../tools';
import { arithmeticReward, operandsInOrder, problemArgs } from './arithmetic';
import { evaluate, MAX_EXPRESSION_CHARS, randomExpression } from './expression';

export const CALCULATOR_SYSTEM_PROMPT =
  'Compute the value of the expression (multiplication before addition and subtraction). You may use the calculate tool. Put only the final integer in <answer> tags.';

export const calculateTool = defineTool({
  name: 'calculate',
  description: 'Evaluate an integer expression with + - * and parentheses.',
  args: z.strictObject({ expression: z.string().max(MAX_EXPRESSION_CHARS).describe('e.g. "12 * (3 + 4)"') }),
  run: ({ expression }) => evaluate(expression).toString(),
});

export default defineEnvironment({
  name: 'calculator',
  description: 'multi-turn tool use: arithmetic with a calculate tool; reward 1 for the exact answer',
  args: z
    .strictObject({
      ...problemArgs({ operands: 3, digits: 3 }),
      max_turns: z.number().int().positive().default(4).describe('assistant turns allowed (tool calls + answer)'),
    })
    .refine(operandsInOrder, { message: 'min_operands must be <= max_operands', path: ['min_operands'] }),
  create(a) {
    const shape = {
      minOperands: a.min_operands,
      maxOperands: a.max_operands,
      digits: a.digits,
      operators: a.operators,
    };
    return {
      maxTurns: a.max_turns,
      tools: [calculateTool],
      dataset: generatedDataset({
        name: 'calculator',
        key: (example) => String(example.info.expression),
        generate(rng) {
          const expression = randomExpression(rng, shape);
          return {
            prompt: [
              { role: 'system', content: CALCULATOR_SYSTEM_PROMPT },
              { role: 'user', content: expression },
            ],
            answer: evaluate(expression).toString(),
            info: { expression },
          };
        },
      }),
      rubric: [
        {
          name: 'correct',
          fn: ({ completion, example }) => arithmeticReward(lastAssistantText(completion), example.answer),
        },
        { name: 'tool_calls', weight: 0, fn: ({ completion }) => completion.filter((m) => m.role === 'tool').length },
      ],
    };
  },
});
