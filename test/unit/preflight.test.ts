import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { NonRetryableError } from '../../lib/failures';
import { holdsRunConfig } from '../../lib/runfolder/config';
import { RunLayout } from '../../lib/runfolder/layout';

let root: string;
beforeEach(() => (root = fs.mkdtempSync(path.join(os.tmpdir(), 'preflight-'))));
afterEach(() => fs.rmSync(root, { recursive: true, force: true }));

function write(file: string, text: string): void {
  fs.mkdirSync(path.dirname(file), { recursive: true });
  fs.writeFileSync(file, text);
}

/** What `holdsRunConfig` threw: its message and failure type, non-retryable. */
function refusal(fn: () => unknown): { message: string; type: string | null | undefined } {
  try {
    fn();
  } catch (e) {
    // lib/ raises it as NonRetryableError; the activity fails non-retryably with its type (activities/failures.ts).
    expect(e).toBeInstanceOf(NonRetryableError);
    return { message: (e as Error).message, type: (e as NonRetryableError).type };
  }
  throw new Error('expected a refusal');
}

test('a new folder holds no run; the same config again is this run', () => {
  const layout = new RunLayout(path.join(root, 'run'));
  expect(holdsRunConfig(layout, 'rl', '{"a":1}')).toBe(false);
  write(layout.configFile, '{"a":1}');
  expect(holdsRunConfig(layout, 'rl', '{"a":1}')).toBe(true);
});

test('another config of the same kind is a ConfigMismatch naming the file', () => {
  const layout = new RunLayout(path.join(root, 'run'));
  write(layout.sftConfigFile, '{"a":1}');
  expect(refusal(() => holdsRunConfig(layout, 'sft', '{"a":2}'))).toEqual({
    message: `run folder ${layout.dir} holds a run with a different config (${layout.sftConfigFile}); use another run_name or output_dir`,
    type: 'ConfigMismatch',
  });
});

test('a folder of the other kind is refused both ways, even with the same text', () => {
  const sft = new RunLayout(path.join(root, 'sft'));
  write(sft.sftConfigFile, '{}');
  expect(refusal(() => holdsRunConfig(sft, 'rl', '{}'))).toEqual({
    message: `run folder ${sft.dir} holds an SFT run (${sft.sftConfigFile}); use another run_name or output_dir`,
    type: 'ConfigMismatch',
  });
  expect(fs.existsSync(sft.configFile)).toBe(false);
  const rl = new RunLayout(path.join(root, 'rl'));
  write(rl.configFile, '{}');
  expect(refusal(() => holdsRunConfig(rl, 'sft', '{}'))).toEqual({
    message: `run folder ${rl.dir} holds an RL run (${rl.configFile}); use another run_name or output_dir`,
    type: 'ConfigMismatch',
  });
});
