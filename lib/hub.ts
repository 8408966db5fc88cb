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
import { ConfigError } from './config/errors';

export type RepoType = 'model' | 'dataset';

/** A name that is neither a folder nor in the hub cache: bad input (exit 2). */
export class HubNameError extends ConfigError {}

/** The hub cache folder, as huggingface_hub's constants compute it. */
export function hubCacheDir(env: NodeJS.ProcessEnv = process.env): string {
  const home = env.HF_HOME ?? path.join(env.XDG_CACHE_HOME ?? path.join(os.homedir(), '.cache'), 'huggingface');
  return env.HF_HUB_CACHE ?? env.HUGGINGFACE_HUB_CACHE ?? path.join(home, 'hub');
}

/** `Org/Name` or `Name`, optionally `@revision`: a repository id as the Hub allows them. */
const REPO_ID = /^(?:[A-Za-z0-9][\w.-]*\/)?[A-Za-z0-9][\w.-]*(?:@[\w./-]+)?$/;

/** Where a name was looked for, and the snapshot folder when found. */
export interface HubLookup {
  dir?: string;
  /** The places looked at, for the error. */
  looked: string[];
  /** Why the cache entry did not resolve (no refs/main, a missing snapshot), when it exists. */
  problem?: string;
}

/** The snapshot of `name` in the hub cache (no folder check). */
export function lookupHubCache(name: string, type: RepoType, env: NodeJS.ProcessEnv = process.env): HubLookup {
  const cache = hubCacheDir(env);
  const [repo, revision = 'main'] = name.split('@');
  const repoDir = path.join(cache, [`${type}s`, ...repo.split('/')].join('--'));
  const looked = [repoDir];
  if (!fs.existsSync(repoDir)) return { looked };
  const ref = path.join(repoDir, 'refs', revision);
  let commit: string | undefined;
  if (fs.existsSync(ref)) commit = fs.readFileSync(ref, 'utf8').trim();
  else if (/^[0-9a-f]{40}$/.test(revision)) commit = revision;
  if (commit === undefined) {
    const snapshots = fs.existsSync(path.join(repoDir, 'snapshots'))
      ? fs.readdirSync(path.join(repoDir, 'snapshots'))
      : [];
    return {
      looked,
      problem: `${repoDir} has no refs/${revision} (snapshots there: ${snapshots.join(', ') || 'none'}); name one as ${repo}@<commit>`,
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
