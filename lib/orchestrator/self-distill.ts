/**
 * On-policy self-distillation (`[distill] type = "opsd"`, SDFT, arXiv:2601.19897): the teacher is
 * the policy itself, shown an expert demonstration. Each sample the policy generated is scored by
 * the policy's own server with a system message carrying the demonstration put in front of it,
 * the sample's tokens as they are (not rendered again); the logprobs of the sample's tokens given
 * that prefix are its "teacher" logprobs, and packing makes their difference to the sampled ones
 * each token's advantage, as online distillation does (lib/orchestrator/distill.ts).
 */
import type { Example } from '../envs/types';
import { renderChat } from '../model/chat';
import type { Tokenizer } from '../model/tokenizer';

/** Where an example holds its demonstration: its info, the task a verifiers env put there, or the example (`answer`). */
export function demonstration(example: Example, key: string): string | undefined {
  const info = example.info as Record<string, unknown>;
  const task = info.task_data as Record<string, unknown> | undefined;
  const found = [info[key], task?.[key], (example as unknown as Record<string, unknown>)[key]].find(
    (v) => typeof v === 'string',
  );
  return found as string | undefined;
}

/** The demonstration missing from an example: bad input (the config names a field the rows lack). */
export function missingDemonstration(key: string, env: string, index: number, example: Example): string {
  const fields = [
    ...Object.keys(example.info),
    ...Object.keys((example.info as Record<string, unknown>).task_data ?? {}),
    ...(example.answer !== '' ? ['answer'] : []),
  ];
  return `distill.demo_key = "${key}": example ${index} of ${env} has no such field holding text (it has: ${[...new Set(fields)].join(', ') || 'none'}); name the field that holds the demonstration`;
}

/**
 * The tokens put in front of a sample: the system message `template` (with `{demonstration}`
 * replaced) rendered by the model's chat template alone, with no generation prompt.
 */
export function hintTokens(tokenizer: Tokenizer, template: string, demo: string): number[] {
  const content = template.split('{demonstration}').join(demo);
  return tokenizer.encode(renderChat(tokenizer, [{ role: 'system', content }], { addGenerationPrompt: false }));
}
