/**
 * An SFT dataset ready for training: conversations from a JSONL file or an environment, tokenised
 * with the model's chat template, each a `Sample` for `packSamples`.
 */
import type { EnvSpec } from '../envs/loader';
import type { Split } from '../envs/types';
import type { Tokenizer } from '../model/tokenizer';
import type { Sample } from '../orchestrator/packing';
import type { SftConversation } from './conversation';
import { envConversations } from './env-data';
import { readSftJsonl } from './jsonl';
import { tokenizeConversation } from './tokenize';

/** Where the conversations come from: exactly one of `path` and `env`. */
export interface SftDataSource {
  /** JSONL file of prompt/completion or messages rows. */
  path?: string;
  /** Environment whose examples and demonstrations make the data. */
  env?: EnvSpec;
  /** Rows (the first N of a file) or env examples to take; unset = all (required for generated envs). */
  numExamples?: number;
}

export interface SftDataOptions {
  /** Roles whose messages carry loss (e.g. `['assistant']`). */
  lossRoles: readonly string[];
  /** Seeds env example generation. */
  seed: number;
  /** Called after each conversation is tokenised (tokenising a big dataset takes a while). */
  onProgress?: (done: number, total: number) => void;
}

export interface SftDataset {
  samples: Sample[];
  /** Where each sample came from (`file:line`, `env <id> <split> example <i>`), by index. */
  sources: string[];
}

export function loadSftConversations(source: SftDataSource, split: Split, seed: number): SftConversation[] {
  if (source.path !== undefined && source.env !== undefined)
    throw new Error('SFT data: give a JSONL file (path) or an environment (env), not both');
  if (source.path !== undefined) return readSftJsonl(source.path, source.numExamples);
  if (source.env !== undefined) return envConversations(source.env, split, seed, source.numExamples);
  throw new Error('SFT data: give a JSONL file (path) or an environment (env)');
}

/**
 * Loads and tokenises a dataset. For an env source, `split` picks its train or eval split (the
 * training set and the validation set); a file is its own split.
 */
export function loadSftDataset(
  tokenizer: Tokenizer,
  source: SftDataSource,
  split: Split,
  opts: SftDataOptions,
): SftDataset {
  if (opts.lossRoles.length === 0) throw new Error('SFT data: loss_roles is empty, so no token would carry loss');
  const conversations = loadSftConversations(source, split, opts.seed);
  return {
    samples: conversations.map((c, i) => {
      const sample = tokenizeConversation(tokenizer, c, opts.lossRoles);
      opts.onProgress?.(i + 1, conversations.length);
      return sample;
    }),
    sources: conversations.map((c) => c.source),
  };
}
