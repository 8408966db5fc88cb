/**
 * The cpu worker's prebuilt workflow bundle (workers/bundle.ts): used as it is while it is newer
 * than every file it was built from; a stale or missing one is not used, the worker bundling in its
 * own process and saying why. That `npm run build:ts` leaves a fresh one in dist/, which a real cpu
 * worker then runs, is checked in test/cluster.pieces.test.ts.
 */
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { buildWorkflowBundle, bundleFiles, staleBundle, workflowCode } from '../../workers/bundle';

const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'prime-bundle-'));
afterAll(() => fs.rmSync(dir, { recursive: true, force: true }));

test('a fresh bundle is used as it is; a stale or missing one is not, the worker bundling anew and saying why', async () => {
  await buildWorkflowBundle(dir);
  const files = bundleFiles(dir);
  // The files webpack read: our workflows and the lib/ modules they import, the SDK's.
  const inputs = (JSON.parse(fs.readFileSync(files.inputs, 'utf8')) as { inputs: string[] }).inputs.map((f) =>
    path.resolve(dir, f),
  );
  expect(inputs).toEqual(
    expect.arrayContaining([
      require.resolve('../../workflows/rl'),
      require.resolve('../../lib/runfolder/entries'),
      require.resolve('@temporalio/workflow'),
    ]),
  );
  const said: string[] = [];
  const say = (line: string) => said.push(line);
  expect(await workflowCode(say, dir)).toEqual({ codePath: files.bundle });
  expect(said).toEqual([]);

  // Older than a file it was built from (a workflow recompiled since): not read, the workflows
  // bundled anew in this process, once, saying why. (A second before its newest input: an hour ago
  // would still be newer than every input of a checkout older than that.)
  const newest = Math.max(...inputs.map((f) => fs.statSync(f).mtimeMs));
  const before = new Date(newest - 1000);
  fs.utimesSync(files.bundle, before, before);
  const fresh = await workflowCode(say, dir);
  expect(fresh).not.toHaveProperty('codePath');
  expect((fresh as { code: string }).code).toContain(fs.readFileSync(files.bundle, 'utf8').slice(0, 200));
  expect(said).toEqual([
    expect.stringMatching(
      /^workflow bundle not used: .+ changed after it was built \(npm run build:ts rebuilds it\); bundling the workflows in this process/,
    ),
  ]);

  // Its list of inputs gone, or the bundle: missing.
  fs.rmSync(files.inputs);
  expect(staleBundle(dir)).toBe(`${files.bundle} or its list of inputs is missing (npm run build:ts builds them)`);
}, 60_000);
