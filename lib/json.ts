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

/**
 * The deepest a JSON value we are handed may nest (objects and arrays inside each other; the top
 * level is 1). Far above any real request body or config (an OpenAI tool's JSON schema nests a
 * dozen levels), far below what recursive code can take: Node's IPC deserializer overflowed its
 * stack on a chat nested about 2,000 deep, and config merging on a config nested as deep.
 */
export const MAX_JSON_DEPTH = 64;

/**
 * The path (keys and indexes) to the first object or array of `value` nested deeper than
 * `maxDepth`, or undefined when none is. Iterative: a value of any depth is walked without recursion.
 */
export function pathTooDeep(value: unknown, maxDepth = MAX_JSON_DEPTH): (string | number)[] | undefined {
  interface Frame {
    value: object;
    depth: number;
    parent?: Frame;
    key?: string | number;
  }
  const isNode = (v: unknown): v is object => typeof v === 'object' && v !== null;
  const stack: Frame[] = isNode(value) ? [{ value, depth: 1 }] : [];
  while (stack.length > 0) {
    const frame = stack.pop()!;
    if (frame.depth > maxDepth) {
      const keys: (string | number)[] = [];
      for (let f: Frame | undefined = frame; f?.parent; f = f.parent) keys.push(f.key!);
      return keys.reverse();
    }
    // Pushed in reverse, so the first too-deep value in document order is found first.
    const push = (key: string | number, child: unknown) => {
      if (isNode(child)) stack.push({ value: child, depth: frame.depth + 1, parent: frame, key });
    };
    if (Array.isArray(frame.value)) for (let i = frame.value.length - 1; i >= 0; i--) push(i, frame.value[i]);
    else {
      const keys = Object.keys(frame.value);
      for (let i = keys.length - 1; i >= 0; i--) push(keys[i], (frame.value as Record<string, unknown>)[keys[i]]);
    }
  }
  return undefined;
}

/** A too-deep path for an error message: its first keys (`messages.0.x.a.a.a...`). */
export function describeDeepPath(keys: readonly (string | number)[], shown = 6): string {
  const head = keys.slice(0, shown).join('.');
  return keys.length > shown ? `${head}...` : head;
}

/** How much of a non-string value `textOf` writes: it goes into error messages and logs. */
const TEXT_OF_MAX = 2000;

/**
 * A value from outside (a wire message, a config file) as text: a string as it is, anything else
 * as JSON, so an object someone sent where a string belongs reads as itself, not "[object Object]".
 * The JSON is cut at TEXT_OF_MAX characters; what JSON cannot write (a cycle, a BigInt, nesting past
 * the stack) is named by its type tag, a primitive by String().
 */
export function textOf(value: unknown): string {
  if (typeof value === 'string') return value;
  let json: string | undefined;
  try {
    json = JSON.stringify(value);
  } catch {
    json = undefined;
  }
  // String() of nested arrays recurses as JSON does: an object's tag is enough to name it.
  if (json === undefined)
    return typeof value === 'object' && value !== null ? Object.prototype.toString.call(value) : String(value);
  return json.length > TEXT_OF_MAX ? `${json.slice(0, TEXT_OF_MAX)}... (${json.length} characters)` : json;
}
