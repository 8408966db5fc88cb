/** `model create` and `model plan`: a random-initialised model folder, and the memory one rank needs. */
import { z } from 'zod';
import { ARCHS } from '../names';
import { positiveInt, seed } from './common';
import { SHARDING_HELP, SHARDINGS } from './dist';

export const modelCreateSchema = z.strictObject({
  arch: z.enum(ARCHS).default('qwen3').describe('architecture'),
  preset: z.enum(['tiny', 'small']).default('tiny').describe('size preset; explicit sizes below override it'),
  tokenizer: z.enum(['bytes', 'qwen3']).default('bytes').describe('byte-level tokenizer, or the real Qwen3 one'),
  seed: seed(),
  out: z.string().min(1).describe('folder to write'),
  dtype: z.enum(['float32', 'bfloat16']).default('float32').describe('dtype of the saved weights'),
  hidden_size: positiveInt().optional().describe('model width'),
  intermediate_size: positiveInt().optional().describe('MLP width'),
  num_layers: positiveInt().optional().describe('decoder blocks'),
  num_heads: positiveInt().optional().describe('attention heads'),
  num_kv_heads: positiveInt().optional().describe('key/value heads (GQA)'),
  head_dim: positiveInt().optional().describe('per-head width; unset = hidden_size / num_heads'),
  max_position_embeddings: positiveInt().optional().describe('context length'),
  rope_theta: z.number().positive().optional().describe('RoPE base'),
  tie_word_embeddings: z.boolean().optional().describe('share embedding and output weights'),
  // Mixture of experts (qwen3_moe only); unset = the preset's.
  num_experts: positiveInt().optional().describe('qwen3_moe: experts per sparse block'),
  num_experts_per_tok: positiveInt().optional().describe('qwen3_moe: experts each token is routed to (top-k)'),
  moe_intermediate_size: positiveInt().optional().describe('qwen3_moe: width of each expert MLP'),
  decoder_sparse_step: positiveInt().optional().describe('qwen3_moe: block l is sparse when (l + 1) % step == 0'),
  mlp_only_layers: z.array(z.number().int().nonnegative()).optional().describe('qwen3_moe: blocks kept dense'),
  norm_topk_prob: z.boolean().optional().describe('qwen3_moe: renormalise the top-k routing weights to sum to 1'),
});

/** `prime-rl model plan`: the memory a training rank needs (lib/trainer/plan.ts). */
export const modelPlanSchema = z.strictObject({
  model: z
    .string()
    .min(1)
    .describe('a Hugging Face model folder (its config.json is read) or a preset: qwen3-8b, qwen3-32b'),
  world_size: positiveInt().default(1).describe('trainer ranks (one per device)'),
  sharding: z.enum(SHARDINGS).optional().describe(`${SHARDING_HELP}; unset = both, side by side`),
  seq_len: positiveInt().default(4096).describe('tokens of one packed row (rows train one at a time)'),
  ac: z.boolean().default(false).describe('activation checkpointing of every decoder layer ([trainer.model.ac])'),
  dtype: z
    .enum(['bfloat16', 'float32'])
    .default('bfloat16')
    .describe('compute dtype: bfloat16 = mixed precision over fp32 master weights (GPU), float32 = fp32 throughout'),
  lora_rank: z
    .number()
    .int()
    .nonnegative()
    .default(0)
    .describe('LoRA rank with adapters on every projection; 0 = full fine-tuning'),
  device_memory_gib: z.number().positive().default(80).describe('memory of one device, for the longest row that fits'),
});

export type ModelCreateConfig = z.output<typeof modelCreateSchema>;
export type ModelPlanConfig = z.output<typeof modelPlanSchema>;
