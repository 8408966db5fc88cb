/**
 * The building blocks every section uses: a strict section filled from its defaults, number
 * shapes, the keys several commands share (seq_len, output_dir, run_name, ...) and the check that
 * max_tokens leaves room for a prompt.
 */
import { z } from 'zod';
import { textOf } from '../../json';
import { outputDirProblem, RUN_NAME_MAX } from '../output-dir';

/** A config section: strict (unknown keys are errors) and filled from its defaults when absent. */
export function section<T extends z.core.$ZodLooseShape>(shape: T) {
  return z.strictObject(shape).prefault({} as never);
}

export const positiveInt = () => z.number().int().positive();
export const nonNegative = () => z.number().nonnegative();

export const seqLen = () => positiveInt().default(2048).describe('max tokens of one packed row / one sequence');
export const maxSteps = () => positiveInt().optional().describe('number of optimizer steps; unset = no limit');
export const outputDir = () =>
  z
    .string()
    .min(1)
    .superRefine((dir, ctx) => {
      const problem = outputDirProblem(dir);
      if (problem) ctx.addIssue({ code: 'custom', message: problem });
    })
    // prefault: the default goes through the check too.
    .prefault('outputs')
    .describe('root of run folders, checkpoints and the local Temporal database');
export const seed = () => z.number().int().nonnegative().default(0).describe('random seed');
export const asyncLevel = () =>
  z
    .number()
    .int()
    .nonnegative()
    .default(1)
    .describe('rollouts of step n use policy weights no older than n - async_level');
/** A run name's shape (no default). */
export const runNameString = () =>
  z
    .string()
    .regex(/^[A-Za-z0-9][A-Za-z0-9._-]*$/, 'letters, digits, ., _ and - only')
    .max(RUN_NAME_MAX, {
      error: (iss) =>
        `${textOf(iss.input).length} characters; at most ${RUN_NAME_MAX} (it names a folder of output_dir and a workflow)`,
    });
export const runName = (dflt: string) =>
  runNameString().default(dflt).describe('run name: the folder under output_dir and the Temporal workflow id');
export const threads = () =>
  positiveInt().optional().describe('compute threads of the native engine; unset = all cores');

/**
 * max_tokens is a turn's most new tokens; the context still ends a turn earlier (a turn gets at
 * most what seq_len leaves after its prompt), so max_tokens = seq_len means "up to the context"
 * (as prime-rl's max_completion_tokens). More than seq_len can never be reached: an error.
 */
export function checkMaxTokens(
  ctx: z.core.$RefinementCtx,
  at: string[],
  maxTokens: number | undefined,
  seqLen: number,
  seqLenKey: string,
): void {
  if (maxTokens === undefined || maxTokens <= seqLen) return;
  ctx.addIssue({
    code: 'custom',
    path: at,
    message: `${maxTokens} is above ${seqLenKey} (${seqLen}): prompt + completion must fit in ${seqLenKey}, so no turn could reach it; lower max_tokens to at most ${seqLen} or raise ${seqLenKey}`,
  });
}
