/** Reading JSON files with errors that name the file. */
import { FileRefused, readBoundedText } from './files';

/**
 * What is wrong with text JSON.parse refused, without quoting it: V8 messages quote the start of
 * the text ("Unexpected token 'r', "root:x:0:0"... is not valid JSON"), and the text may be a file
 * a link pointed at, which an error must never reveal. Positions become line and column.
 */
export function jsonSyntaxError(e: unknown, text: string): string {
  const message = (e as Error).message ?? '';
  const at = /at position (\d+)/.exec(message);
  let where = '';
  if (at) {
    const before = text.slice(0, Number(at[1])).split('\n');
    where = ` at line ${before.length}, column ${before[before.length - 1].length + 1}`;
  }
  if (/^Unexpected end/.test(message)) return `unexpected end of input${where}`;
  if (/^Unexpected token/.test(message)) return `unexpected character${where}`;
  // Other V8 messages name the grammar, not the text ("Expected ',' or '}' after property value").
  const grammar = message.replace(/ in JSON at position \d+| at position \d+/, '');
  return grammar.includes('"') ? `syntax error${where}` : `${grammar}${where}`;
}

/** Above the largest tokenizer.json on the Hub (tens of MiB) with room to spare, below what V8 can hold as one string. */
export const MAX_JSON_FILE_BYTES = 256 << 20;

/** A JSON file whose top level is an object; a device, a FIFO or a file over `maxBytes` is refused unread. */
export function readJsonFile(file: string, maxBytes = MAX_JSON_FILE_BYTES): Record<string, unknown> {
  let text: string;
  try {
    text = readBoundedText(file, maxBytes);
  } catch (e) {
    if (e instanceof FileRefused) throw new Error(e.message);
    throw new Error(`${file}: cannot read (${(e as NodeJS.ErrnoException).code ?? (e as Error).message})`);
  }
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch (e) {
    throw new Error(`${file}: not valid JSON (${jsonSyntaxError(e, text)})`);
  }
  if (parsed === null || typeof parsed !== 'object' || Array.isArray(parsed))
    throw new Error(`${file}: not a JSON object`);
  return parsed as Record<string, unknown>;
}
