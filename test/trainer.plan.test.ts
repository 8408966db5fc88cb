/**
 * The memory plan (`prime-rl model plan`, lib/trainer/plan.ts) on the presets' public shapes. Its
 * weights, gradients and AdamW state are checked against what ranks account in
 * test/native.dist.test.ts; here: the counts, how the modes compare, and the command.
 */
import { spawnSync } from 'node:child_process';
import * as path from 'node:path';
import { readHfConfigShape } from '../lib/model/hf';
import { parameterCount } from '../lib/model/tensors';
import { projectRoot } from '../lib/paths';
import { longestRow, memoryPlan, type PlanInput } from '../lib/trainer/plan';

/** A preset on `worldSize` ranks under full sharding: bf16, checkpointed rows of 8192 tokens. */
const onRanks = (name: string, worldSize: number): PlanInput => ({
  config: readHfConfigShape(path.join(projectRoot, 'configs', 'models', name)).config,
  worldSize,
  sharding: 'full',
  seqLen: 8192,
  ac: true,
  dtype: 'bfloat16',
  loraRank: 0,
});
const GiB = 2 ** 30;

test('Qwen3-8B on 8 ranks: full sharding holds 1/8 of the fp32 state, ZeRO-1 all of it but the moments', () => {
  const p = onRanks('qwen3-8b', 8);
  expect(parameterCount(p.config)).toBe(8_190_735_360);
  const full = memoryPlan(p);
  const zero = memoryPlan({ ...p, sharding: 'optimizer' });
  expect(full.parameters).toBe(8_190_735_360);
  expect(full.weights).toBe(4 * full.units.reduce((n, u) => n + Math.ceil(u.numel / 8), 0));
  expect(full.gradients).toBe(full.weights);
  expect(full.optimizer).toBe(2 * full.weights);
  expect(zero.weights).toBe(4 * full.parameters);
  expect(zero.gradients).toBe(4 * full.parameters);
  // ZeRO-1 does not fit an 80 GB card at all; full sharding leaves room for long rows.
  expect(zero.total).toBeGreaterThan(80 * GiB);
  expect(full.total).toBeLessThan(40 * GiB);
  expect(longestRow(p, 80 * GiB)).toBeGreaterThan(32_768);
  expect(longestRow({ ...p, sharding: 'optimizer' }, 80 * GiB)).toBe(0);
  // Checkpointing trades recompute for memory; more ranks leave more room.
  expect(memoryPlan({ ...p, ac: false }).activations).toBeGreaterThan(3 * full.activations);
  expect(longestRow({ ...p, worldSize: 16 }, 80 * GiB)).toBeGreaterThan(longestRow(p, 80 * GiB));
});

test('Qwen3-32B on 32 ranks fits 80 GB with full sharding', () => {
  const p = onRanks('qwen3-32b', 32);
  expect(parameterCount(p.config)).toBe(32_762_123_264);
  expect(memoryPlan(p).total).toBeLessThan(80 * GiB);
  expect(memoryPlan({ ...p, sharding: 'optimizer' }).total).toBeGreaterThan(80 * GiB);
});

function plan(args: string[]) {
  const r = spawnSync(process.execPath, [path.join(projectRoot, 'bin', 'prime-rl.js'), 'model', 'plan', ...args], {
    cwd: projectRoot,
    encoding: 'utf8',
  });
  return { code: r.status, stdout: r.stdout, stderr: r.stderr };
}

test('prime-rl model plan prints both modes for a preset; a bad model exits 2 naming the key', () => {
  const r = plan(['--model', 'qwen3-8b', '--world-size', '8', '--seq-len', '8192', '--ac']);
  expect(r.code).toBe(0);
  expect(r.stdout).toContain('8.19B parameters');
  expect(r.stdout).toMatch(/GiB per rank\s+optimizer\s+full/);
  expect(r.stdout).toMatch(/longest packed row in 80 GiB\s+0\s+\d+/);
  const bad = plan(['--model', '/nonexistent']);
  expect(bad.code).toBe(2);
  expect(bad.stderr).toMatch(/model: '\/nonexistent' is neither a model folder .* nor a preset \(.*qwen3-8b/);
});
