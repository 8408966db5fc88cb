/**
 * The local launcher (`prime-rl sft|rl|eval`) sharing its Temporal dev server: a second command
 * finds the first one's server listening and runs on it; the first, when it ends, must not take the
 * server from under the second.
 */
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { loadConfig } from '../lib/config/loader';
import { sftSchema, type SFTConfig } from '../lib/config/schemas';
import { createModel } from '../lib/model/create';
import { freePort } from '../lib/net';
import { devServerPidFile, isListening } from '../lib/temporal/devserver';
import { launchSft } from '../workers/launcher';

jest.setTimeout(5 * 60_000);

const root = fs.mkdtempSync(path.join(os.tmpdir(), 'prime-launcher-'));
const modelDir = path.join(root, 'model');
const outputDir = path.join(root, 'outputs');

beforeAll(() => createModel({ arch: 'qwen3', preset: 'tiny', tokenizer: 'bytes', seed: 0, out: modelDir }));
afterAll(() => fs.rmSync(root, { recursive: true, force: true }));

test('a command that started the dev server leaves it running for another command still using it', async () => {
  const [port, uiPort] = [await freePort(), await freePort()];
  const sft = (name: string, steps: number): SFTConfig =>
    loadConfig({
      schema: sftSchema,
      argv: [
        '--run-name', name, '--model.name', modelDir, '--output-dir', outputDir, '--seq-len', '128', '--threads', '1',
        '--max-steps', String(steps), '--batch-size', '4', '--data.env', '{"id": "reverse-text"}', '--data.num-examples', '16',
        '--temporal.port', String(port), '--temporal.ui-port', String(uiPort), '--temporal.task-queue', name,
      ],
      env: {},
    }).config;

  const first = await launchSft(sft('first', 2), { quiet: true });
  let serverPid: number | undefined;
  try {
    serverPid = first.processes.temporal.pid;
    expect(serverPid).toBeDefined();
    expect((await first.result).steps).toBe(2);

    const second = await launchSft(sft('second', 6), { quiet: true });
    try {
      expect(second.processes.temporal.pid).toBeUndefined(); // it found the first one's server
      await first.stop();
      expect(await isListening('127.0.0.1', port)).toBe(true);
      expect(fs.readFileSync(devServerPidFile(outputDir), 'utf8').trim()).toBe(String(serverPid));
      expect((await second.result).steps).toBe(6);
    } finally {
      await second.stop();
    }
  } finally {
    await first.stop();
    if (serverPid !== undefined) {
      try {
        process.kill(serverPid, 'SIGTERM');
      } catch {
        // already gone
      }
    }
  }
});
