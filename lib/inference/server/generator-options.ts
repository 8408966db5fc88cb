/**
 * The engine generator's options from a server's config: the value of each config key that
 * registers itself as a generator option (config/schemas/engine-options.ts), and the sequence
 * length the server computes; and, for an option the engine refuses, the key that set it.
 */
import type * as native from '../../../native';
import { inferenceSchema, type InferenceConfig } from '../../config/schemas';
import { registeredGeneratorKeys, type RegisteredGeneratorKey } from '../../config/schemas/engine-options';

const GENERATOR_KEYS = registeredGeneratorKeys(inferenceSchema);

export function generatorOptionsOf(config: InferenceConfig, contextLength: number): native.GeneratorOptions {
  const options: Record<string, unknown> = { maxSequenceLength: contextLength };
  for (const { path, option, invert } of GENERATOR_KEYS) {
    const value = path.reduce<unknown>((section, name) => (section as Record<string, unknown>)[name], config);
    if (value !== undefined) options[option] = invert ? !value : value;
  }
  return options as unknown as native.GeneratorOptions;
}

/** The key (`inference.model.paged_attention_kernel`) and hint for a refused option, where it has one. */
export function refusedKeyOf(option: string): { key: string; hint: string } | undefined {
  const found = GENERATOR_KEYS.find(
    (k): k is RegisteredGeneratorKey & { refusedHint: string } => k.option === option && !!k.refusedHint,
  );
  return found && { key: `inference.${found.path.join('.')}`, hint: found.refusedHint };
}
