/**
 * Config keys that set an engine generator option (native/src/generation.h's
 * PRIME_GENERATOR_OPTIONS). A key registers itself where its schema declares it, naming the option:
 *
 *   block_size: positiveInt().default(GENERATOR_DEFAULTS.blockSize).describe('...')
 *     .register(generatorOptionKeys, { option: 'blockSize' }),
 *
 * The inference server hands every registered key's value to the engine, and maps the engine's
 * refusal of an option back to its key (lib/inference/server/index.ts). A new generator option is
 * then its line in C++ and its registered key; test/unit/config.engine-options.test.ts fails while
 * an option the engine declares is neither registered nor listed in ENGINE_ONLY_OPTIONS.
 */
import { z } from 'zod';
import { GENERATOR_DEFAULTS, type GeneratorOptions } from '../../../native/engine-types.generated';

export type GeneratorOptionName = keyof GeneratorOptions;

export interface GeneratorOptionKey {
  /** The engine option the key sets. */
  option: GeneratorOptionName;
  /** The key says the opposite of the option (enforce_eager = true sets cudaGraphs false). */
  invert?: true;
  /** For an option the device or the build may refuse: what the user can do instead. */
  refusedHint?: string;
}

export const generatorOptionKeys = z.registry<GeneratorOptionKey>();

/**
 * The options no config key sets: the server computes maxSequenceLength (seq_len within the
 * model's positions); stateSlots and tensorSampler are the engine's own and its tests'.
 */
export const ENGINE_ONLY_OPTIONS: readonly GeneratorOptionName[] = ['maxSequenceLength', 'stateSlots', 'tensorSampler'];

/** Every option the engine declares: those with a default, and the two it requires. */
export const GENERATOR_OPTION_NAMES: readonly GeneratorOptionName[] = [
  'maxSequences',
  'maxSequenceLength',
  ...(Object.keys(GENERATOR_DEFAULTS) as GeneratorOptionName[]),
];

/** A registered key: its path in the section's config (`['model', 'enforce_eager']`) and what it sets. */
export interface RegisteredGeneratorKey extends GeneratorOptionKey {
  path: string[];
}

/** The registered keys in a section's schema, nested sections included, in declaration order. */
export function registeredGeneratorKeys(schema: z.ZodType, prefix: string[] = []): RegisteredGeneratorKey[] {
  const keys: RegisteredGeneratorKey[] = [];
  const object = objectInside(schema);
  for (const [name, field] of Object.entries(object?.shape ?? {}) as [string, z.ZodType][]) {
    const meta = generatorOptionKeys.get(field);
    if (meta) keys.push({ ...meta, path: [...prefix, name] });
    keys.push(...registeredGeneratorKeys(field, [...prefix, name]));
  }
  return keys;
}

/** The object schema a field wraps (in a default, prefault or optional), if any. */
function objectInside(field: z.ZodType): z.ZodObject | undefined {
  let s: z.ZodType | undefined = field;
  while (s && !(s instanceof z.ZodObject)) {
    s = (s._zod.def as { innerType?: z.ZodType }).innerType;
  }
  return s;
}
