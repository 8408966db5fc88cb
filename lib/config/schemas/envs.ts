/** [[env]] entries and the renderer of verifiers environments' env servers. */
import { z } from 'zod';

export const envSchema = z
  .strictObject({
    id: z.string().min(1).describe('environment id: a built-in, a module path, or an npm package'),
    args: z.record(z.string(), z.unknown()).default({}).describe('arguments passed to the environment loader'),
    weight: z.number().positive().default(1).describe('sampling weight in the environment mix'),
  })
  .describe('environment');

/**
 * The renderer verifiers env servers render and tokenize the policy's chats with (verifiers'
 * `TrainClientConfig.renderer`, a `renderers.RendererConfig`: `name` and that renderer's fields,
 * checked by the env server). Unset: the renderer auto-resolves from the model's name.
 */
export const rendererSchema = () =>
  z
    .record(z.string(), z.unknown())
    .refine((r) => typeof r.name === 'string' && r.name !== '', {
      message: 'needs a name: the renderer (renderers package): auto, default, qwen3, prime-qwen3, ...',
    })
    .optional()
    .describe(
      "the renderer verifiers environments' env servers render with (verifiers TrainClientConfig.renderer: name and its fields); unset = resolved from the model's name. Our own environments render with the model's chat template",
    );
