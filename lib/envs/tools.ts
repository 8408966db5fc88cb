/**
 * Tool calling in the Qwen / ChatML style: the model writes
 *   <tool_call>
 *   {"name": "calculate", "arguments": {"expression": "2+3"}}
 *   </tool_call>
 * in its turn; the environment runs each call and answers with one `role: "tool"` message per
 * call (the chat template renders them as `<tool_response>` blocks). Malformed calls are answered
 * with an error message rather than ending the rollout, so the model can see and fix its mistake.
 */
import { z } from 'zod';
import type { Message, ToolSchema } from './types';

export interface Tool<A = unknown> {
  name: string;
  description: string;
  /** Validates the call's arguments; its JSON schema is what the model is shown. */
  args: z.ZodType<A>;
  run(args: A): string | Promise<string>;
}

/** Typed constructor for a tool (the argument type is inferred from the schema). */
export function defineTool<A>(t: Tool<A>): Tool<A> {
  return t;
}

// eslint-disable-next-line @typescript-eslint/no-explicit-any -- a tool of any argument type
export function toolSchema(t: Tool<any>): ToolSchema {
  const { $schema: _drop, ...parameters } = z.toJSONSchema(t.args) as Record<string, unknown>;
  return { type: 'function', function: { name: t.name, description: t.description, parameters } };
}

export type ParsedToolCall = { name: string; arguments: Record<string, unknown> } | { error: string };

const TOOL_CALL = /<tool_call>([\s\S]*?)<\/tool_call>/g;

/** Every `<tool_call>` block of `text`, in order; a block that is not valid call JSON gives `{error}`. */
export function parseToolCalls(text: string): ParsedToolCall[] {
  const calls: ParsedToolCall[] = [];
  for (const m of text.matchAll(TOOL_CALL)) {
    let parsed: unknown;
    try {
      parsed = JSON.parse(m[1].trim());
    } catch {
      calls.push({ error: 'tool call is not valid JSON' });
      continue;
    }
    if (typeof parsed !== 'object' || parsed === null || typeof (parsed as { name?: unknown }).name !== 'string') {
      calls.push({ error: 'tool call needs a "name" string' });
      continue;
    }
    const { name, arguments: rawArgs = {} } = parsed as { name: string; arguments?: unknown };
    // Some models write the arguments as a JSON string, as the OpenAI API transports them.
    let args = rawArgs;
    if (typeof args === 'string') {
      try {
        args = JSON.parse(args);
      } catch {
        calls.push({ error: `arguments of "${name}" are not valid JSON` });
        continue;
      }
    }
    if (typeof args !== 'object' || args === null || Array.isArray(args)) {
      calls.push({ error: `arguments of "${name}" must be a JSON object` });
      continue;
    }
    calls.push({ name, arguments: args as Record<string, unknown> });
  }
  return calls;
}

/**
 * Runs the calls of an assistant turn and returns one tool message each. A tool that throws is
 * reported to the model (`error: ...`) like a bad call: tool failures are part of the task, not
 * environment bugs.
 */
// eslint-disable-next-line @typescript-eslint/no-explicit-any -- tools of any argument type
export async function runToolCalls(tools: readonly Tool<any>[], calls: readonly ParsedToolCall[]): Promise<Message[]> {
  const out: Message[] = [];
  for (const call of calls) {
    if ('error' in call) {
      out.push({ role: 'tool', content: `error: ${call.error}` });
      continue;
    }
    const t = tools.find((candidate) => candidate.name === call.name);
    if (!t) {
      out.push({
        role: 'tool',
        name: call.name,
        content: `error: unknown tool "${call.name}"; available: ${tools.map((x) => x.name).join(', ')}`,
      });
      continue;
    }
    const args = t.args.safeParse(call.arguments);
    if (!args.success) {
      out.push({ role: 'tool', name: call.name, content: `error: invalid arguments: ${z.prettifyError(args.error)}` });
      continue;
    }
    let content: string;
    try {
      content = await t.run(args.data);
    } catch (err) {
      content = `error: ${err instanceof Error ? err.message : String(err)}`;
    }
    out.push({ role: 'tool', name: call.name, content });
  }
  return out;
}
