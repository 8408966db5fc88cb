/** [model]: the engine's settings every model section shares (name, dtype, device). */
import { z } from 'zod';
import { section } from './common';

/** cpu, cuda (the current CUDA device) or cuda:N. */
export const deviceSchema = () =>
  z
    .string()
    .regex(/^(cpu|cuda(:\d+)?)$/, "expected 'cpu', 'cuda' or 'cuda:N' (N a device index)")
    .default('cpu')
    .describe('device for the native engine: cpu, cuda or cuda:N');
/** bfloat16 trains in mixed precision: fp32 master weights and optimizer state, bf16 matmuls. */
export const computeDtypeSchema = () =>
  z
    .enum(['float32', 'bfloat16'])
    .default('float32')
    .describe('compute dtype; training in bfloat16 keeps fp32 master weights and optimizer state (mixed precision)');

export const modelFields = () => ({
  name: z
    .string()
    .min(1)
    .describe(
      'a Hugging Face model folder (made by `prime-rl model create` or trained), or a model name (Org/Name) in the local Hugging Face cache',
    ),
  dtype: computeDtypeSchema(),
  device: deviceSchema(),
});
export const modelSchema = () => section(modelFields());
