/** What `ckpt.keep_last` removes from a run folder once a checkpoint is saved (the saveCheckpoint activity). */
import * as fs from 'node:fs';
import * as path from 'node:path';
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
