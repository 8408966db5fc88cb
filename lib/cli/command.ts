/** A CLI command: its zod config schema and what it does with the resolved config. */
import type { z } from 'zod';
import type { Alias } from '../config/aliases';
import type { SharedKeys } from '../config/loader';
import type { HubRef } from '../hub';
import type { PartUse } from '../optional-parts';

export interface Command<S extends z.ZodType = z.ZodType> {
  summary: string;
  schema: S;
  /** Top-level keys that fill the same keys of several sections (rl). */
  shared?: SharedKeys;
  /** Keys of another spelling that map onto the schema's, by table (the Python prime-rl's: lib/config/aliases.ts, prime-rl.ts). */
  aliases?: readonly (readonly Alias[])[];
  /** The models and datasets the config names (a folder, or a Hugging Face name resolved from the local cache). */
  hubNames?(config: z.output<S>): HubRef[];
  /** The optional parts the config uses (installed before it runs, on first use: lib/optional-parts.ts). */
  parts?(config: z.output<S>): PartUse[];
  /** A leading argument that is not an option sets this key (`runs show RUN`). */
  positional?: string;
  run(config: z.output<S>): Promise<void>;
  /** What `--dry-run` writes besides the resolved config (rl's sbatch script): a line for stderr, or none. */
  dryRun?(config: z.output<S>): Promise<string | undefined>;
}

/** Declares a command with its config type inferred from its schema. */
export function command<S extends z.ZodType>(c: Command<S>): Command {
  return c as unknown as Command;
}
