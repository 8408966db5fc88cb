/**
 * Hugging Face names (`Org/Name`) from the local cache, offline, as transformers and datasets
 * resolve them with HF_HUB_OFFLINE=1: a name that is an existing folder is that folder; otherwise
 * it is a repository in the hub cache (HF_HUB_CACHE, else HUGGINGFACE_HUB_CACHE, else
 * HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub, else ~/.cache/huggingface/hub), laid out as
 * huggingface_hub writes it: `<cache>/models--Org--Name/snapshots/<commit>`, the commit read from
 * `refs/main` (or `refs/<revision>` for `Org/Name@<revision>`; a revision that is a commit names
 * its snapshot directly). Nothing is ever downloaded: a name found nowhere is an error saying
 * where it looked and the command that downloads it.
 */
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { HubNameError } from './failures';
import { FileRefused, readBoundedText } from './files';

export type RepoType = 'model' | 'dataset';

/** The hub cache folder, as huggingface_hub's constants compute it. */
export function hubCacheDir(env: NodeJS.ProcessEnv = process.env): string {
  const home = env.HF_HOME ?? path.join(env.XDG_CACHE_HOME ?? path.join(os.homedir(), '.cache'), 'huggingface');
  return env.HF_HUB_CACHE ?? env.HUGGINGFACE_HUB_CACHE ?? path.join(home, 'hub');
}

/** `Org/Name` or `Name`, optionally `@revision`: a repository id as the Hub allows them. */
const REPO_ID = /^(?:[A-Za-z0-9][\w.-]*\/)?[A-Za-z0-9][\w.-]*(?:@[\w./-]+)?$/;

/**
 * A revision as huggingface_hub files it under `refs/`: a branch or tag name (`main`, `v1.0`,
 * `refs/pr/1`), each of its segments a name, never `.`, `..` or empty, so that it stays a path
 * inside the repository's `refs/`.
 */
const REVISION = /^[A-Za-z0-9_][\w.-]*(?:\/[A-Za-z0-9_][\w.-]*)*$/;
/** A commit: what a ref file holds, and what names a snapshot folder. */
const COMMIT = /^[0-9a-f]{40}$/;
/** A ref file holds a commit hash and a newline; anything much longer is not one, and is not read. */
const MAX_REF_BYTES = 256;

/** Where a name was looked for, and the snapshot folder when found. */
export interface HubLookup {
  dir?: string;
  /** The places looked at, for the error. */
  looked: string[];
  /** Why the cache entry did not resolve (no refs/main, a missing snapshot), when it exists. */
  problem?: string;
  /** Why the name cannot be in any cache (a revision that is not a name). */
  invalid?: string;
}

/** A value from a config for an error message: itself, cut when long. */
const shown = (v: string) => JSON.stringify(v.length > 80 ? `${v.slice(0, 77)}...` : v);

/**
 * The snapshot of `name` in the hub cache (no folder check). The revision is checked as a name and
 * the commit a ref file holds as a hash before either becomes part of a path: nothing outside the
 * repository's folder is read or named, and what a ref file holds is never printed.
 */
export function lookupHubCache(name: string, type: RepoType, env: NodeJS.ProcessEnv = process.env): HubLookup {
  const cache = hubCacheDir(env);
  const at = name.indexOf('@');
  const [repo, revision] = at < 0 ? [name, 'main'] : [name.slice(0, at), name.slice(at + 1)];
  const repoDir = path.join(cache, [`${type}s`, ...repo.split('/')].join('--'));
  const looked = [repoDir];
  if (!REVISION.test(revision))
    return {
      looked,
      invalid: `the revision ${shown(revision)} is not a branch, tag or commit name (names separated by '/', none of them '.' or '..')`,
    };
  if (!fs.existsSync(repoDir)) return { looked };
  const ref = path.join(repoDir, 'refs', revision);
  let commit: string | undefined;
  if (fs.existsSync(ref)) {
    let text: string;
    try {
      text = readBoundedText(ref, MAX_REF_BYTES);
    } catch (e) {
      const why =
        e instanceof FileRefused
          ? 'is not a small regular file'
          : `cannot be read (${(e as NodeJS.ErrnoException).code})`;
      return { looked, problem: `${ref} ${why}: a ref file holds a commit hash` };
    }
    if (!COMMIT.test(text.trim()))
      return { looked, problem: `${ref} does not hold a commit hash (40 hex digits); download the revision again` };
    commit = text.trim();
  } else if (COMMIT.test(revision)) commit = revision;
  if (commit === undefined) {
    const snapshotsDir = path.join(repoDir, 'snapshots');
    const snapshots = fs.existsSync(snapshotsDir) ? fs.readdirSync(snapshotsDir).filter((c) => COMMIT.test(c)) : [];
    const list =
      snapshots.length > 5
        ? `${snapshots.slice(0, 5).join(', ')} and ${snapshots.length - 5} more`
        : snapshots.join(', ');
    return {
      looked,
      problem: `${repoDir} has no refs/${revision} (snapshots there: ${list || 'none'}); name one as ${repo}@<commit>`,
    };
  }
  const dir = path.join(repoDir, 'snapshots', commit);
  if (!fs.existsSync(dir)) return { looked, problem: `refs/${revision} names ${commit}, but ${dir} does not exist` };
  return { dir, looked };
}

/** The command that puts `name` into the cache (run where there is network). */
export function downloadCommand(name: string, type: RepoType): string {
  const [repo, revision] = name.split('@');
  return `hf download ${repo}${type === 'dataset' ? ' --repo-type dataset' : ''}${revision ? ` --revision ${revision}` : ''} (or: huggingface-cli download ...)`;
}

/**
 * The folder `name` stands for: itself when it is a folder (relative to the working directory),
 * else its snapshot in the hub cache. `key` names the config key in the error.
 */
export function resolveHubName(
  name: string,
  type: RepoType,
  key: string,
  env: NodeJS.ProcessEnv = process.env,
): string {
  const local = path.resolve(name);
  if (fs.existsSync(local) && fs.statSync(local).isDirectory()) return local;
  if (!REPO_ID.test(name))
    throw new HubNameError(
      `${key}: ${name} is not a folder (${local} does not exist) nor a Hugging Face name (Org/Name)`,
    );
  const found = lookupHubCache(name, type, env);
  if (found.dir) return found.dir;
  if (found.invalid) throw new HubNameError(`${key}: ${name.slice(0, name.indexOf('@'))}@...: ${found.invalid}`);
  throw new HubNameError(
    `${key}: ${name} is not a folder and not in the local Hugging Face cache (looked at ${local} and ${found.looked.join(', ')}` +
      `${found.problem ? `: ${found.problem}` : ''}; HF_HUB_CACHE, HF_HOME or ~/.cache/huggingface pick the cache). ` +
      `Nothing is downloaded at run time: download it first with \`${downloadCommand(name, type)}\`, or give a folder`,
  );
}

/** Whether `name` is a hub name rather than a folder (for the --dry-run listing). */
export function isHubName(name: string): boolean {
  const local = path.resolve(name);
  return !(fs.existsSync(local) && fs.statSync(local).isDirectory()) && REPO_ID.test(name);
}

/** A model folder: `model.name`, a teacher, an eval model. */
export const resolveModelDir = (name: string, key = 'model.name') => resolveHubName(name, 'model', key);

/**
 * How a verifiers env server names the model (its requests' `model`, and what its renderer loads):
 * a hub name as given, so the renderer resolves from it as in prime-rl and transformers loads it
 * from the same cache offline; a folder by its absolute path, and so a name with a revision
 * (transformers takes revisions apart from names).
 */
export function verifiersModelName(name: string): string {
  if (!isHubName(name)) return path.resolve(name);
  return name.includes('@') ? resolveModelDir(name) : name;
}

/** A model or dataset a config names, by its key. */
export interface HubRef {
  key: string;
  name: string;
  type: RepoType;
}

/**
 * The Hugging Face names among `refs` (folders are left out), each with its snapshot folder or why
 * it was found nowhere: what --dry-run lists, and what a command checks before it starts anything.
 */
export function resolveHubRefs(refs: readonly HubRef[]): { ref: HubRef; dir?: string; error?: string }[] {
  return refs
    .filter((r) => isHubName(r.name))
    .map((ref) => {
      try {
        return { ref, dir: resolveHubName(ref.name, ref.type, ref.key) };
      } catch (e) {
        return { ref, error: (e as Error).message };
      }
    });
}
