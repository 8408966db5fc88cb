/**
 * Tokenises an SFT conversation with the model's chat template and builds its loss mask by role.
 *
 * Each loss message's token span is found by rendering the conversation up to it: it starts where
 * the conversation before it ends (for an assistant message, after the generation prompt
 * `<|im_start|>assistant\n`, which the model never writes itself) and ends with the message's last
 * end-of-turn token (`<|im_end|>`), so the mask covers exactly what the model would generate in
 * that turn, as in RL. Roles other than assistant have no generation prompt, so their span starts
 * at their role header. This only works when the template has the prefix property (the tokens of a
 * conversation's beginning are a prefix of the whole conversation's tokens); it is checked for
 * every span, and a template without it fails with the row named.
 */
import { renderChatTemplate } from '../model/chat';
import type { Tokenizer } from '../model/tokenizer';
import type { Message } from '../envs/types';
import type { Sample } from '../runfolder/packing';
import type { SftConversation } from './conversation';

/** Ids near the first difference, for an error message a person can act on. */
function firstDifference(tokenizer: Tokenizer, prefix: readonly number[], full: readonly number[]): string {
  let k = 0;
  while (k < prefix.length && k < full.length && prefix[k] === full[k]) k++;
  const show = (ids: readonly number[]) => JSON.stringify(tokenizer.decode(ids.slice(k, k + 12)));
  return `at token ${k}: ${show(prefix)} alone vs ${show(full)} in the whole conversation`;
}

function isPrefix(prefix: readonly number[], full: readonly number[]): boolean {
  if (prefix.length > full.length) return false;
  for (let i = 0; i < prefix.length; i++) if (prefix[i] !== full[i]) return false;
  return true;
}

/**
 * The conversation's tokens with a loss mask of 1 on the spans of messages whose role is in
 * `lossRoles`. Logprobs and advantages are zeros (SFT uses neither). `chatTemplate`: a Jinja chat
 * template to render with instead of the tokenizer's own (a data source's renderer).
 */
export function tokenizeConversation(
  tokenizer: Tokenizer,
  conv: SftConversation,
  lossRoles: readonly string[],
  chatTemplate?: string,
): Sample {
  const { messages, tools, source } = conv;
  const template = chatTemplate ?? tokenizer.chatTemplate;
  if (template === undefined)
    throw new Error(`${source}: the tokenizer has no chat_template (tokenizer_config.json or chat_template.jinja)`);
  const encode = (msgs: Message[], addGenerationPrompt: boolean): number[] => {
    try {
      return tokenizer.encode(
        renderChatTemplate(template, msgs, { tools, addGenerationPrompt, specialTokens: tokenizer.specialTokensMap }),
      );
    } catch (e) {
      throw new Error(`${source}: the chat template failed: ${(e as Error).message}`);
    }
  };
  const full = encode(messages, false);
  /** Token count of `msgs` rendered alone, checked to be a prefix of the whole conversation. */
  const boundary = (msgs: Message[], addGenerationPrompt: boolean, what: string): number => {
    const ids = encode(msgs, addGenerationPrompt);
    if (!isPrefix(ids, full)) {
      throw new Error(
        `${source}: the chat template lacks the prefix property: ${what} does not tokenize to a prefix of the whole conversation ` +
          `(${firstDifference(tokenizer, ids, full)}), so the loss mask cannot be placed; use a template that renders earlier turns the same whatever follows`,
      );
    }
    return ids.length;
  };

  const roles = new Set(lossRoles);
  const endOfTurn = new Set(tokenizer.eosTokenIds);
  const lossMask = new Uint8Array(full.length);
  let lossMessages = 0;
  messages.forEach((m, i) => {
    if (!roles.has(m.role)) return;
    lossMessages++;
    const start =
      i === 0
        ? 0
        : boundary(messages.slice(0, i), m.role === 'assistant', `the conversation before message ${i} (${m.role})`);
    const end = boundary(messages.slice(0, i + 1), false, `the conversation up to message ${i} (${m.role})`);
    let stop = end;
    while (stop > start && !endOfTurn.has(full[stop - 1])) stop--;
    if (stop === start) stop = end; // no end-of-turn token in the span: the whole span carries loss
    if (stop <= start) throw new Error(`${source}: message ${i} (${m.role}) renders to no tokens`);
    lossMask.fill(1, start, stop);
  });
  if (lossMessages === 0) {
    throw new Error(
      `${source}: no message has a loss role (${[...roles].join(', ')}), so the sample has nothing to train on`,
    );
  }
  const n = full.length;
  return { inputIds: Int32Array.from(full), lossMask, logprobs: new Float32Array(n), advantages: new Float32Array(n) };
}
