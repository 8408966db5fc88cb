/**
 * What a run folder no longer needs: what `ckpt.keep_last` removes once a checkpoint is saved (the
 * saveCheckpoint activity), and the policy folders every server has moved past (recordStep).
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import { evalResultsFile } from '../eval/results';
import { listSteps, type RunLayout } from '../runfolder/layout';

/**
 * With keep_last = K: the K newest checkpoints stay; batches older than the oldest kept one are
 * no longer needed for a replay, nor weights older than it minus async_level (in-flight rollouts).
 */
export function pruneRunFolder(layout: RunLayout, keepLast: number | undefined, asyncLevel: number): void {
  if (keepLast === undefined || !fs.existsSync(layout.checkpointsRoot)) return;
  const ckpts = listSteps(fs.readdirSync(layout.checkpointsRoot));
  const kept = ckpts.slice(-keepLast);
  for (const s of ckpts.slice(0, -keepLast)) fs.rmSync(layout.checkpointDir(s), { recursive: true, force: true });
  const oldest = kept[0];
  const drop = (root: string, file: (s: number) => string, below: number) => {
    if (!fs.existsSync(root)) return;
    const names = fs.readdirSync(root).map((n) => n.replace(/\.safetensors$/, ''));
    for (const s of listSteps(names)) if (s < below) fs.rmSync(file(s), { recursive: true, force: true });
  };
  drop(path.dirname(layout.batchFile(0)), (s) => layout.batchFile(s), oldest);
  drop(layout.weightsRoot, (s) => layout.weightsDir(s), oldest - asyncLevel);
}

/**
 * The first policy version an rl run still needs once step `step`, sampled from `policyVersion`,
 * is recorded: later steps sample from newer versions (step n from n - async_level, in-flight mode
 * from the newest), a server coming back is brought to the current one, and an eval due
 * (`eval.interval`, from the base model on) needs the weights of the version it evaluates.
 */
export function firstNeededVersion(layout: RunLayout, policyVersion: number, evalInterval: number | undefined): number {
  if (evalInterval === undefined) return policyVersion;
  let due = 0;
  while (due < policyVersion && fs.existsSync(evalResultsFile(layout.dir, due === 0 ? 'base' : `step_${due}`)))
    due += evalInterval;
  return Math.min(due, policyVersion);
}

/**
 * Removes the policy folders `weights/step_v` of versions below `from`, except those a checkpoint
 * keeps: a resume from checkpoint c (ckpt.resume_step, or a rewind) samples its first steps from
 * versions c - async_level .. c. Returns the versions removed. Idempotent.
 */
export function prunePolicyWeights(layout: RunLayout, from: number, asyncLevel: number): number[] {
  if (!fs.existsSync(layout.weightsRoot)) return [];
  const checkpoints = fs.existsSync(layout.checkpointsRoot) ? listSteps(fs.readdirSync(layout.checkpointsRoot)) : [];
  const kept = (v: number) => checkpoints.some((c) => v >= c - asyncLevel && v <= c);
  const removed: number[] = [];
  for (const v of listSteps(fs.readdirSync(layout.weightsRoot))) {
    if (v >= from || kept(v)) continue;
    fs.rmSync(layout.weightsDir(v), { recursive: true, force: true });
    removed.push(v);
  }
  return removed;
}
