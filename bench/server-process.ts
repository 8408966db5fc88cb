/**
 * `prime-rl inference` in a process of its own, as a user runs it, for the serving benchmarks
 * (bench/serving.ts, bench/agentic-concurrency.ts): started on any port, read from its `/metrics`.
 */
import { spawn, type ChildProcess } from 'node:child_process';
import * as path from 'node:path';

export interface ServerProcess {
  url: string;
  child: ChildProcess;
  stop(): Promise<void>;
}

/** How the server computes: device, dtype, threads (CPU, float32 and 2 by default). */
export interface Compute {
  device?: string;
  dtype?: string;
  threads?: string;
}

/** `prime-rl inference` of checkout `root` serving modelDir (any port) with these flags, once it listens. */
export async function startServerProcess(
  root: string,
  modelDir: string,
  tmp: string,
  flags: string[],
  compute: Compute = {},
): Promise<ServerProcess> {
  const common = [
    ...[
      '--model.name',
      modelDir,
      '--model.device',
      compute.device ?? 'cpu',
      '--model.dtype',
      compute.dtype ?? 'float32',
    ],
    ...['--threads', compute.threads ?? '2', '--output-dir', tmp, '--server.port', '0'],
  ];
  const child = spawn(process.execPath, [path.join(root, 'bin', 'prime-rl.js'), 'inference', ...common, ...flags], {
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let out = '',
    err = '';
  child.stdout!.on('data', (d) => (out += d));
  child.stderr!.on('data', (d) => (err += d));
  const url = await new Promise<string>((resolve, reject) => {
    child.stdout!.on('data', () => {
      const m = out.match(/on (http:\/\/[\d.]+:\d+)/);
      if (m) resolve(m[1]!);
    });
    child.once('exit', (code) => reject(new Error(`server exited ${code}: ${err}`)));
  });
  return {
    url,
    child,
    stop: () =>
      new Promise<void>((resolve) => {
        child.once('exit', () => resolve());
        child.kill('SIGTERM');
      }),
  };
}

/** A gauge or counter without labels on the server's `/metrics` (NaN where it has none). */
export async function serverMetric(url: string, name: string): Promise<number> {
  const text = await (await fetch(`${url}/metrics`)).text();
  const m = new RegExp(`^${name} (\\S+)$`, 'm').exec(text);
  return m ? Number(m[1]) : NaN;
}
