/**
 * The GPU checks (bench/gpu/checks.ts) without jest, for a bare GPU machine (scripts/gpu/run.sh):
 * prints a table, writes <file>.md and <file>.json to --out after each check (a run cut short keeps
 * what it finished), exits 1 when a check fails.
 *
 *   node dist/bench/gpu-checks.js [--device cuda|cuda:N|cpu] [--out DIR] [--set all|kernels|groups]
 *     [--only SUBSTRINGS] [--skip SUBSTRINGS] [--file checks]
 *
 * --set: a named set of checks (CHECK_SETS; default all). --only / --skip: comma-separated
 * substrings of check names ('training step,LoRA'); a check runs when it contains one of --only's
 * (or there is no --only) and none of --skip's. --file: the stem of the files written (default
 * checks). --device defaults to cuda when the addon sees a CUDA device, else cpu (the bf16 checks
 * then skip). PRIME_PYTHON names the Python with torch and transformers (default python3).
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import * as native from '../native';
import { writeFileAtomic } from '../lib/atomic';
import type { CheckResult } from './gpu/check';
import { CHECK_SETS, makeWorkDir } from './gpu/checks';

function arg(name: string): string | undefined {
  const i = process.argv.indexOf(`--${name}`);
  if (i < 0) return undefined;
  const v = process.argv[i + 1];
  if (v === undefined || v.startsWith('--')) {
    console.error(`gpu-checks: --${name} needs a value`);
    process.exit(2);
  }
  return v;
}

async function main() {
  const known = new Set(['--device', '--out', '--only', '--skip', '--set', '--file']);
  for (let i = 2; i < process.argv.length; i += 2) {
    if (!known.has(process.argv[i])) {
      console.error(`gpu-checks: unknown argument ${process.argv[i]} (known: ${[...known].join(', ')})`);
      process.exit(2);
    }
  }
  const info = native.info();
  const device = arg('device') ?? (info.cuda ? 'cuda' : 'cpu');
  if (!/^(cpu|cuda(:\d+)?)$/.test(device)) {
    console.error(`gpu-checks: --device must be cpu, cuda or cuda:N, not '${device}'`);
    process.exit(2);
  }
  const set = arg('set') ?? 'all';
  if (!CHECK_SETS[set]) {
    console.error(`gpu-checks: --set must be one of ${Object.keys(CHECK_SETS).join(', ')}, not '${set}'`);
    process.exit(2);
  }
  const file = arg('file') ?? 'checks';
  if (!/^[\w.-]+$/.test(file)) {
    console.error(`gpu-checks: --file is a file name stem (letters, digits, '.', '_', '-'), not '${file}'`);
    process.exit(2);
  }
  const out = arg('out');
  const list = (v: string | undefined) => (v ?? '').split(',').filter((x) => x !== '');
  const only = list(arg('only')),
    skip = list(arg('skip'));
  const has = (name: string, subs: string[]) => subs.some((x) => name.includes(x));
  const ctx = { device, workDir: makeWorkDir(), python: process.env.PRIME_PYTHON || 'python3' };
  console.log(`[gpu-checks] torch ${info.torchVersion}, cuda ${info.cuda}, device ${device}, work dir ${ctx.workDir}`);

  const rows: Array<{ check: string; seconds: number } & CheckResult> = [];
  const table = () =>
    [
      `GPU checks on ${device} (torch ${info.torchVersion}, cuda ${info.cuda})`,
      '',
      '| check | result | seconds | detail |',
      '| --- | --- | --- | --- |',
      ...rows.map((r) => `| ${r.check} | ${r.status} | ${r.seconds.toFixed(1)} | ${r.detail.replaceAll('|', '/')} |`),
    ].join('\n');
  // Each check's result is in the output folder as soon as it exists.
  const write = () => {
    if (!out) return;
    fs.mkdirSync(out, { recursive: true });
    writeFileAtomic(path.join(out, `${file}.md`), table() + '\n');
    writeFileAtomic(path.join(out, `${file}.json`), JSON.stringify({ device, info, rows }, null, 2) + '\n');
  };
  for (const check of CHECK_SETS[set].filter((c) => (only.length === 0 || has(c.name, only)) && !has(c.name, skip))) {
    const t0 = Date.now();
    let result: CheckResult;
    try {
      result = await check.run(ctx);
    } catch (e) {
      result = { status: 'fail', detail: `error: ${(e as Error).message.split('\n')[0]}` };
    }
    rows.push({ check: check.name, seconds: (Date.now() - t0) / 1000, ...result });
    console.log(`[gpu-checks] ${result.status.padEnd(4)} ${check.name}: ${result.detail}`);
    write();
  }
  console.log('\n' + table());
  write();
  if (out) {
    const rlLog = path.join(ctx.workDir, 'rl.log');
    if (fs.existsSync(rlLog)) fs.copyFileSync(rlLog, path.join(out, 'rl.log'));
  }
  process.exit(rows.some((r) => r.status === 'fail') ? 1 : 0);
}

main().catch((e: unknown) => {
  console.error(e);
  process.exit(1);
});
