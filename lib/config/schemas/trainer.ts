/** [trainer]: the trained model and everything one optimizer step needs (SFT reuses its parts). */
import { z } from 'zod';
import { maxSteps, nonNegative, outputDir, positiveInt, section, seed, seqLen, threads } from './common';
import { trainerScaleShape } from './dist';
import { klPenaltySchema, lossSchema } from './loss';
import { loraSchema } from './lora';
import { modelFields } from './model';
import { optimizerSchema, schedulerSchema, withLrDefault } from './optim';

/** The trained model (SFT, the RL trainer): the engine's settings plus activation checkpointing and fused kernels. */
export const trainerModelSchema = () =>
  section({
    ...modelFields(),
    fused_kernels: z
      .boolean()
      .default(false)
      .describe(
        "run RMSNorm (with the residual add), RoPE, SwiGLU and the LM head's softmax rows as the engine's fused CUDA kernels instead of libtorch's ops (device cuda; off until checked on a card: docs/gpu.md, Fused training kernels)",
      ),
    ac: z
      .strictObject({
        freq: positiveInt().default(1).describe('checkpoint every freq-th decoder layer (layers 0, freq, 2 freq, ...)'),
      })
      .optional()
      .describe(
        'activation checkpointing (dense models): checkpointed layers keep only their input and run again in the backward; absent = off',
      ),
  }).superRefine((m, ctx) => {
    if (m.fused_kernels && m.device === 'cpu')
      ctx.addIssue({
        code: 'custom',
        path: ['fused_kernels'],
        message:
          "the fused kernels are CUDA kernels: set the model's device to cuda (or cuda:N), or leave fused_kernels off",
      });
  });

/** Mixture-of-experts training options (no effect on dense models). */
const moeTrainShape = {
  router_aux_loss_coef: nonNegative()
    .default(0)
    .describe("weight of the router's load-balancing loss (transformers' definition) added to the loss"),
};
export const moeTrainSchema = section(moeTrainShape);
/** RL adds router replay: rollouts carry the experts inference used. */
const moeRlTrainSchema = section({
  ...moeTrainShape,
  router_replay: z
    .boolean()
    .default(false)
    .describe(
      "MoE models only: rollouts keep the experts inference routed each token to, and the trainer sends tokens through them instead of its router's top-k",
    ),
});

export const trainerSchema = z
  .strictObject({
    model: trainerModelSchema(),
    seq_len: seqLen(),
    max_steps: maxSteps(),
    output_dir: outputDir(),
    seed: seed(),
    threads: threads(),
    optim: optimizerSchema,
    scheduler: schedulerSchema,
    loss: lossSchema,
    kl_penalty: klPenaltySchema,
    lora: loraSchema,
    moe: moeRlTrainSchema,
    ...trainerScaleShape,
  })
  .prefault({})
  .transform(withLrDefault);

export type TrainerConfig = z.output<typeof trainerSchema>;
