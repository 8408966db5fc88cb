/**
 * SFT datasets as JSONL files, one conversation per line, in either form:
 *
 *   {"prompt": "2 + 2", "completion": "<answer>4</answer>"}
 *   {"prompt": [{"role": "system", ...}, {"role": "user", ...}], "completion": [{"role": "assistant", ...}]}
 *   {"messages": [{"role": "user", ...}, {"role": "assistant", ...}], "tools": [...]}
 *
 * A string prompt is one user message, a string completion one assistant message; when a row has
 * both forms, `messages` wins. Other fields (ids, metadata) are ignored. Bad rows are errors that
 * name the file and line.
 */
import * as fs from 'node:fs';
import { z } from 'zod';
import type { Message } from '../envs/types';
import { describeIssues, messageSchema, toolDefinitionSchema, type SftConversation } from './conversation';

const turnsSchema = (role: 'user' | 'assistant') =>
  z.union([z.string().transform((content): Message[] => [{ role, content }]), z.array(messageSchema).min(1)]);

const rowSchema = z
  .looseObject({
    prompt: turnsSchema('user').optional(),
    completion: turnsSchema('assistant').optional(),
    messages: z.array(messageSchema).min(1).optional(),
    tools: z.array(toolDefinitionSchema).optional(),
  })
  .refine((r) => r.messages !== undefined || (r.prompt !== undefined && r.completion !== undefined), {
    message: 'a row needs `messages`, or both `prompt` and `completion`',
  });

/** Parses one JSONL line into a conversation; `source` (`file:line`) names it in errors. */
export function parseSftRow(text: string, source: string): SftConversation {
  let json: unknown;
  try {
    json = JSON.parse(text);
  } catch (e) {
    throw new Error(`${source}: not valid JSON (${(e as Error).message})`);
  }
  return sftRowConversation(json, source);
}

/** One row (a JSON object, or a parquet row as an object) as a conversation; `source` names it in errors. */
export function sftRowConversation(json: unknown, source: string): SftConversation {
  const parsed = rowSchema.safeParse(json);
  if (!parsed.success) throw new Error(`${source}: ${describeIssues(parsed.error)}`);
  const row = parsed.data;
  const messages = row.messages ?? [...row.prompt!, ...row.completion!];
  return { messages, tools: row.tools ?? [], source };
}

/** Reads the conversations of a JSONL file (blank lines skipped); `limit` keeps the first N. */
export function readSftJsonl(file: string, limit?: number): SftConversation[] {
  if (!fs.existsSync(file)) throw new Error(`SFT dataset ${file} does not exist`);
  const out: SftConversation[] = [];
  const lines = fs.readFileSync(file, 'utf8').split('\n');
  for (let i = 0; i < lines.length && (limit === undefined || out.length < limit); i++) {
    if (lines[i].trim() === '') continue;
    out.push(parseSftRow(lines[i], `${file}:${i + 1}`));
  }
  if (out.length === 0) throw new Error(`SFT dataset ${file} has no rows`);
  if (limit !== undefined && out.length < limit)
    throw new Error(`SFT dataset ${file} has ${out.length} rows, fewer than the ${limit} asked for`);
  return out;
}
