/**
 * Processes a launcher finds left over (lib/proc.ts). A killed process does not vanish at once:
 * its main thread can be a zombie while its other threads still exit (a large process unmapping
 * its memory, a thread in a slow syscall), and until the last one is gone its sockets stay open.
 * The re-run of a killed launcher took such a process for gone and found its inference port taken
 * (issue #42: "inference.server.port ... is already in use", 3 of 3 tries).
 */
import { spawn } from 'node:child_process';
import * as path from 'node:path';
import { freePort } from '../lib/net';
import { isRunning, processId, processState, terminateProcess } from '../lib/proc';
import { isListening } from '../lib/temporal/devserver';
import { until } from './support/processes';

const FIXTURE = path.join(__dirname, 'fixtures', 'zombie-leader.py');

test('a process whose main thread exited runs until its last thread is gone, and terminating it waits for that', async () => {
  const port = await freePort();
  const child = spawn('python3', [FIXTURE, String(port), '3'], { stdio: ['ignore', 'pipe', 'inherit'] });
  const exited = new Promise((r) => child.once('exit', r));
  try {
    await new Promise((r) => child.stdout.once('data', r));
    const id = processId(child.pid)!;
    expect(id).toBeDefined();
    await until('the main thread to exit', () => processState(id.pid) === 'Z', 10_000);
    // A zombie main thread, a live thread still holding the port: the process still runs.
    expect(await isListening('127.0.0.1', port)).toBe(true);
    expect(isRunning(id)).toBe(true);
    // So terminating it signals it (a process taken for gone was never signalled) and returns
    // only once nothing of it is left, and with it the port.
    await terminateProcess(id, 1_000);
    expect(isRunning(id)).toBe(false);
    expect(await isListening('127.0.0.1', port)).toBe(false);
  } finally {
    child.kill('SIGKILL');
    await exited;
  }
});
