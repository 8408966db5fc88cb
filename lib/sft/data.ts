/**
 * An SFT dataset ready for training: conversations from a JSONL file, a Hugging Face dataset
 * folder (hub-data.ts) or an environment, tokenised
 * with the model's chat template, each a `Sample` for `packSamples`.
 */
import * as fs from 'node:fs';
import type { EnvSpec } from '../envs/loader';
import type { Split } from '../envs/types';
import type { Tokenizer } from '../model/tokenizer';
import type { Sample } from '../runfolder/packing';
import type { SftConversation } from './conversation';
import { envConversations } from './env-data';
import { readHubDataset } from './hub-data';
import { readSftJsonl } from './jsonl';
import { tokenizeConversation } from './tokenize';

/** Where the conversations come from: exactly one of `path`, `dataset` and `env`. */
export interface SftDataSource {
  /** JSONL file of prompt/completion or messages rows. */
  path?: string;
  /** A dataset folder laid out as on the Hugging Face Hub (`name`: how it was named), and the split to read. */
  dataset?: { dir: string; name: string; split: string };
  /** Environment whose examples and demonstrations make the data. */
  env?: EnvSpec;
  /** Rows (the first N of a file) or env examples to take; unset = all (required for generated envs). */
  numExamples?: number;
  /** A Jinja chat template file to render this source with instead of the model's own. */
  chatTemplate?: string;
  /** Its share of every batch, relative to the other sources' (several sources). */
  ratio?: number;
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

export async function loadSftConversations(
  source: SftDataSource,
  split: Split,
  seed: number,
): Promise<SftConversation[]> {
  const given = [source.path, source.dataset, source.env].filter((s) => s !== undefined).length;
  if (given > 1)
    throw new Error('SFT data: give a JSONL file (path), a dataset (name) or an environment (env), not several');
  if (source.path !== undefined) return readSftJsonl(source.path, source.numExamples);
  if (source.dataset !== undefined)
    return readHubDataset(source.dataset.dir, source.dataset.name, source.dataset.split, source.numExamples);
  if (source.env !== undefined) return envConversations(source.env, split, seed, source.numExamples);
  throw new Error('SFT data: give a JSONL file (path), a dataset (name) or an environment (env)');
}

/**
 * Loads and tokenises a dataset. For an env source, `split` picks its train or eval split (the
 * training set and the validation set); a file is its own split.
 */
export async function loadSftDataset(
  tokenizer: Tokenizer,
  source: SftDataSource,
  split: Split,
  opts: SftDataOptions,
): Promise<SftDataset> {
  if (opts.lossRoles.length === 0) throw new Error('SFT data: loss_roles is empty, so no token would carry loss');
  const conversations = await loadSftConversations(source, split, opts.seed);
  let template: string | undefined;
  if (source.chatTemplate !== undefined) {
    try {
      template = fs.readFileSync(source.chatTemplate, 'utf8');
    } catch (e) {
      throw new Error(`renderer.chat_template ${source.chatTemplate}: ${(e as Error).message}`);
    }
  }
  return {
    samples: conversations.map((c, i) => {
      const sample = tokenizeConversation(tokenizer, c, opts.lossRoles, template);
      opts.onProgress?.(i + 1, conversations.length);
      return sample;
    }),
    sources: conversations.map((c) => c.source),
  };
}
