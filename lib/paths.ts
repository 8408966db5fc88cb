/** Locations inside the installed project, valid both from sources (jest) and from dist/ (the CLI). */
import * as fs from 'node:fs';
import * as path from 'node:path';

function findRoot(start: string): string {
  for (let dir = start; ; dir = path.dirname(dir)) {
    if (fs.existsSync(path.join(dir, 'package.json')) && fs.existsSync(path.join(dir, 'native', 'CMakeLists.txt')))
      return dir;
    if (path.dirname(dir) === dir) throw new Error(`cannot find the prime-rl project root above ${start}`);
  }
}

/** The project root: the folder holding package.json. */
export const projectRoot = findRoot(__dirname);

/** The Temporal CLI that scripts/setup.sh builds (never one from the system). */
export const temporalCliPath = path.join(projectRoot, 'tools', 'bin', 'temporal');
