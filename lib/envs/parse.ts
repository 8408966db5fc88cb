/** Helpers rubrics and envs share to read model output. */
import type { Message } from './types';

/** Python's `str.strip()` whitespace (`str.isspace`), which differs from JS `trim()` at the edges. */
const PY_SPACE = '[\\t\\n\\x0b\\x0c\\r\\x1c-\\x1f \\x85\\xa0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000]';
const PY_STRIP = new RegExp(`^${PY_SPACE}+|${PY_SPACE}+$`, 'gu');

export function pyStrip(text: string): string {
  return text.replace(PY_STRIP, '');
}

function escapeRegExp(text: string): string {
  return text.replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
}

/**
 * The content of the first `<tag>...</tag>` in `text` (non-greedy, across lines), stripped as
 * Python strips; '' when there is none. Same as `re.search(r"<tag>(.*?)</tag>", text, re.DOTALL)`.
 */
export function extractTag(text: string, tag: string): string {
  const t = escapeRegExp(tag);
  const m = new RegExp(`<${t}>([\\s\\S]*?)</${t}>`).exec(text);
  return m ? pyStrip(m[1]) : '';
}

/** Text of the last assistant message ('' if the model never answered). */
export function lastAssistantText(messages: readonly Message[]): string {
  for (let i = messages.length - 1; i >= 0; i--) {
    if (messages[i].role === 'assistant') return messages[i].content ?? '';
  }
  return '';
}
