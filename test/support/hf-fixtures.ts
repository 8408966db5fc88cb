/**
 * The transformers fixtures: one folder per model under test/fixtures/hf-reference/, written by
 * scripts/check_hf_compat.py --write-fixtures (its FIXTURE_MODELS), named after the family
 * (`qwen3_moe`) or after the family and what the variant covers (`qwen3_moe_step2`). Each folder
 * holds the model transformers saved, HF's logits (logits.bin) and meta.json, which says how the
 * model was created and on which tokens the logits are.
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import type { CreateModelOptions } from '../../lib/model/create';

export const HF_FIXTURES_DIR = path.join(__dirname, '..', 'fixtures', 'hf-reference');

export interface HfFixture {
  /** The folder's name. */
  name: string;
  dir: string;
  meta: {
    /** `createModel`'s options for the model (before the script perturbed its weights). */
    createOptions: Omit<CreateModelOptions, 'out'>;
    tokens_a: number[];
    tokens_b: number[];
    /** Hybrid families: a sequence longer than the delta rule's 64-position chunks. */
    tokens_c?: number[];
    /** Hybrid families: transformers' greedy continuation of tokens_a. */
    greedy_a?: number[];
    /** Hybrid families: the loss whose gradient grads.safetensors holds (see meta.json's description). */
    grads?: { loss: number; loss_tokens: number };
    vocab_size: number;
  };
}

/** The token sequences whose logits logits.bin holds, in its order. */
export function fixtureSequences(meta: HfFixture['meta']): number[][] {
  return [meta.tokens_a, meta.tokens_b, ...(meta.tokens_c ? [meta.tokens_c] : [])];
}

/** Every fixture folder, in name order. */
export const HF_FIXTURES: HfFixture[] = fs
  .readdirSync(HF_FIXTURES_DIR, { withFileTypes: true })
  .filter((e) => e.isDirectory())
  .map((e) => e.name)
  .sort()
  .map((name) => {
    const dir = path.join(HF_FIXTURES_DIR, name);
    return { name, dir, meta: JSON.parse(fs.readFileSync(path.join(dir, 'meta.json'), 'utf8')) as HfFixture['meta'] };
  });
