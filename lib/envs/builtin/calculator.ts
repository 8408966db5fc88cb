/**
 * calculator: arithmetic problems with a `calculate` tool. The model may call the tool (Qwen-style
 * `<tool_call>` JSON) any number of turns; results come back as `tool` messages, and the first
 * turn without a tool call is its final answer. Reward 1 for the exact integer in `<answer>` tags.
 */
import { z } from 'zod';
import { defineEnvironment } from '../define';
import { defineTool } from '../tools';
import { correctAnswer, operandsInOrder, problemArgs, problemDataset } from './arithmetic';
import { evaluate, MAX_EXPRESSION_CHARS } from './expression';

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
    return {
      maxTurns: a.max_turns,
      tools: [calculateTool],
      dataset: problemDataset('calculator', CALCULATOR_SYSTEM_PROMPT, a),
      rubric: [
        correctAnswer,
        { name: 'tool_calls', weight: 0, fn: ({ completion }) => completion.filter((m) => m.role === 'tool').length },
      ],
    };
  },
});
