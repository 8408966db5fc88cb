import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { spawnSync } from 'node:child_process';
import { writeDirAtomic } from '../../lib/atomic';

/** A pid that belonged to a process which has exited. */
function deadPid(): number {
  const child = spawnSync(process.execPath, ['-e', '0']);
  return child.pid;
}

test('a folder write sweeps the temp leftovers of writers killed on this host, never a live one', () => {
  const root = fs.mkdtempSync(path.join(os.tmpdir(), 'atomic-'));
  try {
    const dir = path.join(root, 'step_6');
    const host = os.hostname();
    const dead = deadPid();
    const killedTmp = `step_6.tmp-${host}-${dead}-0123abcd`;
    const liveTmp = `step_6.tmp-${host}-${process.pid}-89abcdef`;
    const otherHost = `step_6.tmp-elsewhere.example-${dead}-01234567`;
    const otherStep = `step_8.tmp-${host}-${dead}-76543210`;
    for (const name of [killedTmp, liveTmp, otherHost, otherStep]) fs.mkdirSync(path.join(root, name));
    // A folder by a similar name that is no temp sibling.
    fs.mkdirSync(path.join(root, 'step_6.tmp-notes'));

    writeDirAtomic(dir, (tmp) => fs.writeFileSync(path.join(tmp, 'model.bin'), 'x'));

    expect(fs.readFileSync(path.join(dir, 'model.bin'), 'utf8')).toBe('x');
    expect(fs.readdirSync(root).sort()).toEqual(['step_6', liveTmp, 'step_6.tmp-notes', otherHost, otherStep].sort());
  } finally {
    fs.rmSync(root, { recursive: true, force: true });
  }
});

test('an .old copy left by a killed writer stays while it is the only copy, and goes once the folder is back', () => {
  const root = fs.mkdtempSync(path.join(os.tmpdir(), 'atomic-'));
  try {
    const dir = path.join(root, 'weights');
    const old = path.join(root, `weights.old-${os.hostname()}-${deadPid()}-0123abcd`);
    fs.mkdirSync(old);
    // The folder is missing (killed between the two renames): the sweep before the write keeps the old copy...
    writeDirAtomic(dir, (tmp) => fs.writeFileSync(path.join(tmp, 'a'), '1'));
    expect(fs.existsSync(old)).toBe(true);
    // ...and the next write, with the folder in place, removes it.
    writeDirAtomic(dir, (tmp) => fs.writeFileSync(path.join(tmp, 'a'), '2'));
    expect(fs.readdirSync(root)).toEqual(['weights']);
    expect(fs.readFileSync(path.join(dir, 'a'), 'utf8')).toBe('2');
  } finally {
    fs.rmSync(root, { recursive: true, force: true });
  }
});
