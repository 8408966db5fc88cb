/**
 * The workflows' bundle the cpu worker runs. Webpack takes seconds to bundle them (3-4 s on two busy
 * cores), so `npm run build:ts` bundles them once into dist/workflow-bundle.js (`node
 * dist/workers/bundle.js`), and every cpu worker start, restarts after a kill included, loads that
 * file instead. Beside it, workflow-bundle.json lists the files webpack read (our compiled
 * workflows and lib/, the SDK's modules). A bundle that is missing or older than one of them (a
 * recompiled workflow, an upgraded SDK) is not used: the worker bundles in its own process, as it
 * would without one, and says so once.
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import { bundleWorkflowCode, DefaultLogger, type BundleOptions, type WorkflowBundleOption } from '@temporalio/worker';
import { readJsonFile } from '../lib/json';
import { projectRoot } from '../lib/paths';

const WORKFLOWS = require.resolve('../workflows');
/** Beside the compiled workflows/ and workers/ (dist/); running from the sources, beside them (never built). */
const ROOT = path.join(path.dirname(WORKFLOWS), '..');
/** The bundle in `root` (dist/ by default), and the list of the files it was built from. */
export const bundleFiles = (root = ROOT) => ({
  bundle: path.join(root, 'workflow-bundle.js'),
  inputs: path.join(root, 'workflow-bundle.json'),
});

/** The largest list of inputs read (a real one is tens of KB). */
const MAX_LIST_BYTES = 4 << 20;

interface Inputs {
  /** The files webpack read, relative to the bundle's folder. */
  inputs: string[];
}

type WebpackConfig = Parameters<NonNullable<BundleOptions['webpackConfigHook']>>[0];
type WebpackPlugin = NonNullable<WebpackConfig['plugins']>[number];

/**
 * A file the bundle is made of: the compiled JavaScript, its source maps and the TypeScript they
 * name (edited since, dist/ is stale too: `npm run build:ts` rebuilds both), ours and the SDK's.
 * Not the folders webpack looked in: they change with any file added to them.
 */
const isInput = (file: string): boolean => fs.statSync(file, { throwIfNoEntry: false })?.isFile() === true;

/** Webpack bundles the workflows; `inputs` collects the files it read that are on disk. */
function bundle(inputs?: Set<string>) {
  const collect = {
    apply(compiler: {
      hooks: { afterCompile: { tap(name: string, f: (c: { fileDependencies: Iterable<string> }) => void): void } };
    }) {
      compiler.hooks.afterCompile.tap('workflow-bundle-inputs', (compilation) => {
        for (const f of compilation.fileDependencies) if (isInput(f)) inputs?.add(f);
      });
    },
  } as unknown as WebpackPlugin;
  return bundleWorkflowCode({
    workflowsPath: WORKFLOWS,
    logger: new DefaultLogger('WARN'),
    webpackConfigHook: (config) => ({ ...config, plugins: [...(config.plugins ?? []), collect] }),
  });
}

/** Writes `text` to `file` whole or not at all. */
function writeAtomic(file: string, text: string): void {
  const tmp = `${file}.${process.pid}.tmp`;
  fs.writeFileSync(tmp, text);
  fs.renameSync(tmp, file);
}

/** Bundles the workflows into `root`, with the list of the files it was built from. */
export async function buildWorkflowBundle(root = ROOT): Promise<void> {
  const files = bundleFiles(root);
  const inputs = new Set<string>();
  const { code } = await bundle(inputs);
  const list: Inputs = { inputs: [...inputs].map((f) => path.relative(root, f)).sort() };
  writeAtomic(files.inputs, `${JSON.stringify(list, null, 1)}\n`);
  // The bundle last: it is newer than its list, and a reader finding it finds the list too.
  writeAtomic(files.bundle, code);
}

/** Why the bundle in `root` cannot be used, or undefined when it can. */
export function staleBundle(root = ROOT): string | undefined {
  const files = bundleFiles(root);
  let built: number;
  let list: Partial<Inputs>;
  try {
    built = fs.statSync(files.bundle).mtimeMs;
    fs.statSync(files.inputs);
  } catch {
    return `${files.bundle} or its list of inputs is missing (npm run build:ts builds them)`;
  }
  try {
    // The list is a few hundred paths (tens of KB): a larger file is not one build:ts wrote.
    list = readJsonFile(files.inputs, MAX_LIST_BYTES);
  } catch (e) {
    return `${(e as Error).message} (npm run build:ts rewrites it)`;
  }
  if (!Array.isArray(list.inputs) || !list.inputs.every((f) => typeof f === 'string'))
    return `${files.inputs} is not a list of file paths (npm run build:ts rewrites it)`;
  for (const rel of list.inputs) {
    const file = path.join(root, rel);
    let changed: number;
    try {
      changed = fs.statSync(file).mtimeMs;
    } catch {
      return `${file}, which it was built from, is gone`;
    }
    if (changed > built) return `${file} changed after it was built (npm run build:ts rebuilds it)`;
  }
  return undefined;
}

/**
 * What the cpu worker's `Worker.create` runs: the prebuilt bundle when it is up to date, else the
 * workflows bundled now. `say` gets the one line that explains the slower start.
 */
export async function workflowCode(say: (line: string) => void, root = ROOT): Promise<WorkflowBundleOption> {
  const stale = staleBundle(root);
  if (stale === undefined) return { codePath: bundleFiles(root).bundle };
  say(`workflow bundle not used: ${stale}; bundling the workflows in this process (seconds)`);
  return await bundle();
}

/**
 * For code run from the TypeScript sources (the tests): the bundle `npm run build:ts` left in dist/
 * while it is newer than every file it was made of (these sources included), else these sources
 * bundled now.
 */
export const distWorkflowCode = (say: (line: string) => void): Promise<WorkflowBundleOption> =>
  workflowCode(say, path.join(projectRoot, 'dist'));

if (require.main === module) {
  const started = Date.now();
  buildWorkflowBundle().then(
    () => process.stdout.write(`${bundleFiles().bundle}: the workflows bundled in ${Date.now() - started} ms\n`),
    (e: unknown) => {
      process.stderr.write(`bundling the workflows failed: ${e instanceof Error ? e.stack : String(e)}\n`);
      process.exit(1);
    },
  );
}
