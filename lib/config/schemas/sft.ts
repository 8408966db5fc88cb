/** `sft`: supervised fine-tuning on a dataset, with validation loss and evals between steps. */
import { z } from 'zod';
import { isVerifiersEnv } from '../names';
import { checkpointSchema } from './ckpt';
import { checkMaxTokens, maxSteps, outputDir, positiveInt, runName, section, seed, seqLen, threads } from './common';
import { trainerScaleShape } from './dist';
import { envSchema, rendererSchema } from './envs';
import { evalEnvSchema, evalShape } from './eval';
import { serverSchema } from './inference';
import { loraSchema } from './lora';
import { optimizerSchema, schedulerSchema, withLrDefault } from './optim';
import { temporalSchema, withRunQueue } from './temporal';
import { moeTrainSchema, trainerModelSchema } from './trainer';

/**
 * How a data source's conversations become tokens: the model's own chat template (`auto`,
 * `default`), or another Jinja chat template for this source (`chat_template`, a file).
 */
const sftRendererSchema = z
  .strictObject({
    name: z
      .enum(['auto', 'default'])
      .default('auto')
      .describe("the model folder's chat template (auto and default both name it)"),
    chat_template: z
      .string()
      .min(1)
      .optional()
      .describe(
        "a Jinja chat template file this source renders with instead of the model's (same tokenizer and special tokens)",
      ),
  })
  .describe("how this source's conversations become tokens; unset = the model's chat template");

/** One source of a mix (`[[data.source]]`): a dataset, a JSONL file or an environment, at a ratio. */
const sftSourceSchema = z
  .strictObject({
    name: z
      .string()
      .min(1)
      .optional()
      .describe('a Hugging Face dataset (Org/Name in the local cache) or a folder laid out as on the Hub'),
    path: z.string().min(1).optional().describe('a JSONL file of prompt/completion or messages rows'),
    env: envSchema.optional().describe("an environment whose examples' demonstrations make the data"),
    split: z.string().min(1).default('train').describe('the split of name (by file name as the Hub lays it out)'),
    subset: z
      .string()
      .min(1)
      .optional()
      .describe("name's configuration: the folder of the dataset it names (a dataset with several)"),
    ratio: z
      .number()
      .positive()
      .default(1)
      .describe("this source's share of every batch, relative to the other sources' ratios"),
    num_examples: positiveInt().optional().describe('examples to take from it; unset = all'),
    renderer: sftRendererSchema.optional(),
  })
  .superRefine((src, ctx) => {
    const given = (['name', 'path', 'env'] as const).filter((k) => src[k] !== undefined);
    if (given.length !== 1)
      ctx.addIssue({
        code: 'custom',
        path: given.length > 1 ? [given[1]] : ['name'],
        message:
          given.length > 1
            ? `give one dataset per source: ${given.join(' and ')} are both set`
            : 'a source needs its data: name (a dataset), path (JSONL) or env',
      });
    if (src.subset !== undefined && src.name === undefined)
      ctx.addIssue({ code: 'custom', path: ['subset'], message: 'is a configuration of a dataset (name): set name' });
  });

export const sftSchema = z
  .strictObject({
    run_name: runName('sft'),
    model: trainerModelSchema(),
    seq_len: seqLen(),
    max_steps: maxSteps(),
    epochs: positiveInt().default(1).describe('passes over the dataset (max_steps wins when both are set)'),
    output_dir: outputDir(),
    seed: seed(),
    batch_size: positiveInt()
      .default(32)
      .describe('samples per optimizer step (packed into rows of seq_len; one row per forward/backward)'),
    threads: threads(),
    data: section({
      path: z.string().optional().describe('JSONL dataset (prompt/completion or messages rows)'),
      name: z
        .string()
        .min(1)
        .optional()
        .describe(
          'a Hugging Face dataset: its name (Org/Name) in the local Hugging Face cache, or a folder laid out as on the Hub (parquet or JSONL files, split by file name); rows of prompt/completion or messages',
        ),
      split: z.string().min(1).default('train').describe("data.name's split, by file name as the Hub lays it out"),
      env: envSchema.optional().describe('generate the dataset from an environment instead of a file'),
      num_examples: positiveInt().optional().describe('examples to take; unset = all'),
      loss_roles: z.array(z.string()).default(['assistant']).describe('message roles whose tokens carry loss'),
      source: z
        .array(sftSourceSchema)
        .default([])
        .describe(
          "several sources mixed by ratio (instead of path, name or env): each batch takes each source's share of batch_size, in order",
        ),
    }),
    val: section({
      path: z.string().optional().describe('JSONL validation set; unset = the eval split of data.env'),
      name: z.string().min(1).optional().describe('a Hugging Face dataset as validation set (as data.name)'),
      split: z.string().min(1).default('validation').describe("val.name's split"),
      num_examples: positiveInt()
        .optional()
        .describe('validation examples; unset = all rows of val.path, or 64 examples of data.env'),
      interval: positiveInt().optional().describe('validation loss every N steps (and at the end); unset = off'),
      target_loss: z
        .number()
        .positive()
        .optional()
        .describe(
          'stop once the validation loss is at or below this (checkpoint and weights of that step); needs val.interval',
        ),
    }),
    optim: optimizerSchema,
    scheduler: schedulerSchema,
    lora: loraSchema,
    moe: moeTrainSchema,
    ckpt: checkpointSchema,
    eval: section({
      ...evalShape,
      interval: positiveInt()
        .optional()
        .describe(
          'evaluate the SFT weights on eval.env every N steps (the base model first, and the end); unset = off',
        ),
      env: z.array(evalEnvSchema).default([]).describe('eval environments (required with eval.interval)'),
      renderer: rendererSchema(),
    }),
    inference: section({
      server: serverSchema.describe('the inference server the evals sample from (started when eval.interval is set)'),
    }),
    temporal: temporalSchema,
    trainer: section(trainerScaleShape),
  })
  .superRefine((c, ctx) => {
    const sources = (['path', 'name', 'env'] as const).filter((k) => c.data[k] !== undefined);
    if (sources.length > 1)
      ctx.addIssue({
        code: 'custom',
        path: ['data', sources[1]],
        message: `give one dataset: data.${sources.join(' and data.')} are both set`,
      });
    if (sources.length > 0 && c.data.source.length > 0)
      ctx.addIssue({
        code: 'custom',
        path: ['data', 'source'],
        message: `and data.${sources[0]} are both set: put every dataset in [[data.source]]`,
      });
    if (c.val.path !== undefined && c.val.name !== undefined)
      ctx.addIssue({
        code: 'custom',
        path: ['val', 'name'],
        message: 'give one validation set: val.path and val.name are both set',
      });
    if (c.eval.interval !== undefined && c.eval.env.length === 0)
      ctx.addIssue({
        code: 'custom',
        path: ['eval', 'env'],
        message: 'eval.interval evaluates environments: add [[eval.env]] entries (prime-rl: [[eval.source]])',
      });
    if (c.eval.interval !== undefined)
      checkMaxTokens(ctx, ['eval', 'sampling', 'max_tokens'], c.eval.sampling.max_tokens, c.seq_len, 'seq_len');
    if (c.eval.renderer !== undefined && !c.eval.env.some((e) => isVerifiersEnv(e.id)))
      ctx.addIssue({
        code: 'custom',
        path: ['eval', 'renderer'],
        message:
          "is the renderer of verifiers environments' env servers, and the evals have none: our own environments render with the model's chat template",
      });
    if (c.val.target_loss !== undefined && c.val.interval === undefined) {
      ctx.addIssue({
        code: 'custom',
        path: ['val', 'target_loss'],
        message: 'needs val.interval: the validation loss it is compared with is measured every val.interval steps',
      });
    }
  })
  .transform((c) => withRunQueue(withLrDefault(c)));

export type SFTConfig = z.output<typeof sftSchema>;
