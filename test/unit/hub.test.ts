/**
 * Hugging Face names in the local cache (lib/hub.ts) against a cache that lies: revisions that
 * climb out of it, ref files that point out of it, hold a secret's bytes, or are gigabytes. Each is
 * an error within the cache that prints nothing a file holds.
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import { HubNameError } from '../../lib/failures';
import { resolveHubName } from '../../lib/hub';
import { addToHubCache } from '../support/hub-cache';
import { scratchDir } from '../support/setup';

const { dir } = scratchDir('prime-hub-');
const cache = path.join(dir, 'hub');
const snapshot = addToHubCache(cache, 'model', 'Org/Name', { 'config.json': '{}' });
const repoDir = path.join(cache, 'models--Org--Name');
const secret = path.join(dir, 'secret.txt');
fs.writeFileSync(secret, 'TOPSECRET\n');
const elsewhere = path.join(dir, 'elsewhere');
fs.mkdirSync(elsewhere);

const resolve = (name: string) => resolveHubName(name, 'model', 'model.name', { HF_HUB_CACHE: cache });
const refusal = (name: string): string => {
  try {
    resolve(name);
  } catch (e) {
    expect(e).toBeInstanceOf(HubNameError); // a config error: exit 2
    return (e as Error).message;
  }
  throw new Error(`${name} resolved`);
};

test('a ref, a branch with slashes and a commit resolve to their snapshot', () => {
  const commit = path.basename(snapshot);
  fs.mkdirSync(path.join(repoDir, 'refs', 'refs', 'pr'), { recursive: true });
  fs.writeFileSync(path.join(repoDir, 'refs', 'refs', 'pr', '1'), `${commit}\n`);
  for (const name of ['Org/Name', 'Org/Name@main', 'Org/Name@refs/pr/1', `Org/Name@${commit}`])
    expect(resolve(name)).toBe(snapshot);
});

test('a revision is a name: never ., .., empty, or a way out of refs/', () => {
  // refs/../../../secret.txt is the file above the cache: its content was printed as the commit.
  for (const revision of ['../../../secret.txt', 'main/../../../../secret.txt', '..', '.', 'a//b', '.hidden', 'x/']) {
    const message = refusal(`Org/Name@${revision}`);
    expect(message).toBe(
      `model.name: Org/Name@...: the revision ${JSON.stringify(revision)} is not a branch, tag or commit name (names separated by '/', none of them '.' or '..')`,
    );
  }
});

test('a ref file is read with a bound and must hold a commit hash; what it holds is never printed', () => {
  const ref = (name: string) => path.join(repoDir, 'refs', name);
  // Naming a folder outside the cache (the server loaded it), a link to a secret, a sparse 3 GB
  // file (OOM-killed), a 20 MB one (a 42 MB error message).
  fs.writeFileSync(ref('evil'), '../../../elsewhere');
  fs.symlinkSync(secret, ref('linked'));
  fs.writeFileSync(ref('huge'), '');
  fs.truncateSync(ref('huge'), 3 * 2 ** 30);
  fs.writeFileSync(ref('long'), 'f'.repeat(20 << 20));
  fs.mkdirSync(ref('folder'));
  for (const [revision, why] of [
    ['evil', 'does not hold a commit hash (40 hex digits); download the revision again'],
    ['linked', 'does not hold a commit hash (40 hex digits); download the revision again'],
    ['huge', 'is not a small regular file: a ref file holds a commit hash'],
    ['long', 'is not a small regular file: a ref file holds a commit hash'],
    ['folder', 'is not a small regular file: a ref file holds a commit hash'],
  ]) {
    const message = refusal(`Org/Name@${revision}`);
    expect(message).toContain(`${ref(revision)} ${why}`);
    expect(message).not.toMatch(/TOPSECRET|elsewhere|fffffffff/);
    expect(message.length).toBeLessThan(1000);
  }
});

test('a cache without the ref lists at most five of its snapshots', () => {
  for (let i = 0; i < 30; i++) fs.mkdirSync(path.join(repoDir, 'snapshots', `${i}`.padStart(40, 'a')));
  const message = refusal('Org/Name@v2');
  expect(message).toMatch(/has no refs\/v2 \(snapshots there: (?:[0-9a-f]{40}, ){4}[0-9a-f]{40} and 26 more\)/);
});
