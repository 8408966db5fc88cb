/**
 * An SFT example: one conversation (with the tools its template should list) and where it came
 * from, so every later error can name the file line or the environment example.
 */
import { z } from 'zod';
import type { Message, ToolSchema } from '../envs/types';

export interface SftConversation {
  messages: Message[];
  /** OpenAI function definitions, passed to the chat template. */
  tools: ToolSchema[];
  /** `file.jsonl:12` or `env reverse-text train example 3`. */
  source: string;
}

const toolCallSchema = z.looseObject({
  id: z.string().optional(),
  type: z.literal('function').optional(),
  function: z.looseObject({
    name: z.string().min(1),
    arguments: z.union([z.string(), z.record(z.string(), z.unknown())]),
  }),
});

/** An OpenAI chat message; fields beyond these (e.g. `reasoning_content`) pass through to the template. */
export const messageSchema = z.looseObject({
  role: z.string().min(1),
  content: z.string().nullable(),
  tool_calls: z.array(toolCallSchema).optional(),
  tool_call_id: z.string().optional(),
  name: z.string().optional(),
});

export const toolDefinitionSchema = z.looseObject({
  type: z.literal('function'),
  function: z.looseObject({
    name: z.string().min(1),
    description: z.string().default(''),
    parameters: z.record(z.string(), z.unknown()).default({}),
  }),
});

export function describeIssues(error: z.ZodError): string {
  return error.issues.map((i) => `${i.path.length > 0 ? i.path.join('.') : '(row)'}: ${i.message}`).join('; ');
}
