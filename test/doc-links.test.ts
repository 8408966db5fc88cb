/**
 * `npm run lint:docs` (scripts/check-doc-links.mjs) on a small tree of its own: links, backticked
 * paths and `file:symbol` references that name what is there pass; each kind that names what is
 * not (a moved file, a renamed symbol, a line past the end, a heading gone) fails, named.
 */
import { spawnSync } from 'node:child_process';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';

const SCRIPT = path.join(__dirname, '..', 'scripts', 'check-doc-links.mjs');

function check(docs: string): { status: number | null; problems: string[] } {
  const root = fs.mkdtempSync(path.join(os.tmpdir(), 'doc-links-'));
  try {
    fs.mkdirSync(path.join(root, 'lib', 'run'), { recursive: true });
    fs.writeFileSync(path.join(root, 'lib', 'run', 'rewind.ts'), 'export function rewindRun() {}\nconst LIMIT = 3;\n');
    fs.mkdirSync(path.join(root, 'test', 'fixtures', 'prime-rl', 'repo', 'configs', 'basic'), { recursive: true });
    fs.writeFileSync(path.join(root, 'GUIDE.md'), '# Guide\n\n## Set-up\n');
    fs.writeFileSync(path.join(root, 'README.md'), docs);
    const r = spawnSync(process.execPath, [SCRIPT, root], { encoding: 'utf8' });
    return { status: r.status, problems: r.stderr.split('\n').filter((l) => l.startsWith('README.md:')) };
  } finally {
    fs.rmSync(root, { recursive: true, force: true });
  }
}

test('references to what is there pass', () => {
  expect(
    check(
      [
        '[guide](GUIDE.md#set-up), `lib/run/`, `lib/run/rewind.ts`, `lib/run/rewind.ts:rewindRun`, `lib/run/rewind.ts:2`,',
        "`lib/run/*.ts`, `rewindRun` and `LIMIT` in `lib/run/rewind.ts`, prime-rl's `configs/basic`;",
        'not references: `weights/step_N`, `orchestrator.in_flight.enabled`, `npm run lint`.',
        '```',
        '`lib/nowhere.ts` in a code block is an example',
        '```',
      ].join('\n'),
    ),
  ).toEqual({ status: 0, problems: [] });
});

test('each reference to what is not there fails, named with its line', () => {
  const { status, problems } = check(
    [
      '[guide](GUIDE.md#setup) and [gone](docs/gone.md)',
      '`lib/run-ops/rewind.ts` and `lib/run/rewind.ts:rewindRunOps` and `lib/run/rewind.ts:9`',
      '`rewindRun`, `LIMITS` in `lib/run/rewind.ts`; `lib/run:rewindRun`',
    ].join('\n'),
  );
  expect(status).toBe(1);
  expect(problems).toEqual([
    'README.md:1: GUIDE.md#setup: no heading "#setup" in GUIDE.md',
    'README.md:1: docs/gone.md: no such file',
    "README.md:2: `lib/run-ops/rewind.ts`: no such file or folder (nor in prime-rl's, test/fixtures/prime-rl/repo/)",
    'README.md:2: `lib/run/rewind.ts:rewindRunOps`: no `rewindRunOps` in lib/run/rewind.ts',
    'README.md:2: `lib/run/rewind.ts:9`: lib/run/rewind.ts has 3 lines',
    'README.md:3: `lib/run:rewindRun`: lib/run is a folder, not a file',
    'README.md:3: `lib/run/rewind.ts:LIMITS`: no `LIMITS` in lib/run/rewind.ts',
  ]);
});
