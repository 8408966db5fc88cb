/** The resolved config a run was started with, as stored in its run folder. */
import * as fs from 'node:fs';
import { ApplicationFailure } from '@temporalio/common';
import { rlSchema, type RLConfig } from '../config/schemas';
import { RunLayout } from './layout';

const cache = new Map<string, { mtimeMs: number; config: RLConfig }>();

/** Reads `<runDir>/configs/rl.json`; a missing or invalid file is a non-retryable failure. */
export function readRunConfig(runDir: string): RLConfig {
  const file = new RunLayout(runDir).configFile;
  let stat: fs.Stats;
  try {
    stat = fs.statSync(file);
  } catch {
    throw ApplicationFailure.nonRetryable(`run config ${file} does not exist: was the run prepared?`, 'MissingRunConfig');
  }
  const hit = cache.get(file);
  if (hit && hit.mtimeMs === stat.mtimeMs) return hit.config;
  const parsed = rlSchema.safeParse(JSON.parse(fs.readFileSync(file, 'utf8')));
  if (!parsed.success) throw ApplicationFailure.nonRetryable(`run config ${file} is invalid: ${parsed.error.message}`, 'InvalidRunConfig');
  cache.set(file, { mtimeMs: stat.mtimeMs, config: parsed.data });
  return parsed.data;
}
