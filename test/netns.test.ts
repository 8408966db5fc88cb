/**
 * A run spread over hosts (issue #18, item 5), the hosts being network namespaces on this machine
 * (scripts/netns.sh): the Temporal server, the inference server, the cpu worker and two trainer
 * ranks each in a namespace of its own, reaching each other only by their bridge addresses; the
 * run folder is the shared filesystem. One trainer rank and the inference server are SIGKILLed
 * mid-run and restarted in their namespaces (as a supervisor would); then three links are cut for
 * longer than the run's timeouts and restored (issue #42): cpu worker <-> inference server, trainer
 * rank 1 <-> rank 0, cpu worker <-> Temporal. The run completes with every step once and the
 * trainer's counters equal to its batches (each trained once). The commands are those of
 * docs/cluster.md, "Worked example: five hosts on one machine".
 *
 * Needs root (ip netns, bridges): elsewhere it is skipped, saying so. Names carry a random tag,
 * so parallel runs cannot collide, and everything is removed at the end, also on failure.
 */
import { execFile, spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { promisify } from 'node:util';
import { projectRoot, temporalCliPath } from '../lib/paths';
import { RunLayout } from '../lib/runfolder/layout';
import { taskQueues } from '../lib/temporal/queues';
import { CliProcesses, metricSteps, sleep, until, type CliLaunch } from './support/processes';
import { checkRun } from './support/rl-chaos';
import { tinyModel } from './support/setup';

const tag = randomBytes(3).toString('hex');
const netns = path.join(projectRoot, 'scripts', 'netns.sh');
const ROLES = ['temporal', 'inference', 'cpu', 'trainer0', 'trainer1'] as const;
const STEPS = 12;
/** The run's temporal.heartbeat_timeout_s (5 s) and trainer.dist.timeout_s (10 s), in ms. */
const HEARTBEAT_MS = 5_000;
const DIST_MS = 10_000;
/** How long a link stays cut: past the timeout that sees it, by 2 s (a cut is seen, not waited out). */
const cutMs = (timeoutMs: number) => timeoutMs + 2_000;
type Role = (typeof ROLES)[number];

/** Why namespaces cannot be made here, or undefined when they can. */
function netnsUnusable(): string | undefined {
  if (process.getuid?.() !== 0) return 'not root';
  const probe = spawnSync('ip', ['netns', 'add', `prl-probe-${tag}`], { encoding: 'utf8' });
  if (probe.status !== 0) return `ip netns add failed: ${(probe.stderr || probe.error?.message || '').trim()}`;
  spawnSync('ip', ['netns', 'del', `prl-probe-${tag}`]);
  return undefined;
}
const unusable = netnsUnusable();
if (unusable) console.warn(`test/netns.test.ts skipped: network namespaces unavailable (${unusable})`);

const root = fs.mkdtempSync(path.join(os.tmpdir(), 'prime-netns-'));
const modelDir = path.join(root, 'model');
const outputDir = path.join(root, 'outputs');
const cli = new CliProcesses(path.join(root, 'logs'));
const run = (file: string, args: string[]) => promisify(execFile)(file, args, { encoding: 'utf8' });

afterAll(() => {
  cli.cleanup(); // first: a namespace's name goes with `down`, but its processes would live on
  if (!unusable) spawnSync('bash', [netns, 'down', tag], { stdio: 'inherit' });
  if (!process.env.KEEP_TMP) fs.rmSync(root, { recursive: true, force: true });
});

(unusable ? test.skip : test)(
  'a run over five namespaces survives a SIGKILLed trainer rank and inference server and three cut links, every step once',
  async () => {
    const up = spawnSync('bash', [netns, 'up', tag, ...ROLES], { encoding: 'utf8' });
    if (up.status !== 0) throw new Error(`scripts/netns.sh up failed: ${up.stderr}`);
    // "ROLE NAMESPACE ADDRESS" per line.
    const host = Object.fromEntries(
      up.stdout
        .trim()
        .split('\n')
        .map((l) => l.split(' '))
        .map(([role, ns, ip]) => [role, { ns, ip }]),
    ) as Record<Role, { ns: string; ip: string }>;
    const inNs = (role: Role) => ['ip', 'netns', 'exec', host[role].ns];
    tinyModel(modelDir);

    const temporal = `${host.temporal.ip}:7233`;
    const inferenceUrl = `http://${host.inference.ip}:8000/v1`;
    const queue = `netns-${tag}`;
    const runName = `netns-${tag}`;
    const dist = ['--trainer.dist.host', host.trainer0.ip, '--trainer.dist.port', '29500'];
    dist.push('--trainer.dist.timeout-s', String(DIST_MS / 1000));
    const commands: Record<Exclude<Role, 'temporal'> | 'temporal', string[]> = {
      // 0.0.0.0, not the host's address: the dev server's own services dial each other on 127.0.0.1.
      temporal: ['temporal', 'start', '--temporal.ip', '0.0.0.0', '--output-dir', path.join(root, 'temporal')],
      inference: [
        ...['worker', '--pool', 'inference', '--output-dir', outputDir, '--inference.model.name', modelDir],
        ...['--inference.server.host', host.inference.ip, '--inference.server.port', '8000'],
        ...['--inference.seq-len', '256', '--inference.threads', '1'],
      ],
      cpu: ['worker', '--pool', 'cpu', '--temporal.address', temporal, '--temporal.task-queue', queue],
      trainer0: [
        ...['worker', '--pool', 'trainer', '--trainer.rank', '0', '--trainer.world-size', '2'],
        ...dist,
        ...['--temporal.address', temporal, '--temporal.task-queue', queue, '--threads', '1'],
      ],
      trainer1: [
        ...['worker', '--pool', 'trainer', '--trainer.rank', '1', '--trainer.world-size', '2'],
        ...dist,
        ...['--threads', '1'],
      ],
    };
    const procs = {} as Record<Role, CliLaunch>;
    // Gloo binds the address the hostname resolves to (127.0.0.1 here) unless told the interface;
    // the ranks share the token rank 0 signs their jobs with.
    const token = randomBytes(16).toString('hex');
    const env = (role: Role) =>
      role.startsWith('trainer') ? ['env', 'GLOO_SOCKET_IFNAME=eth0', `TRAINER_DIST_TOKEN=${token}`] : [];
    const start = (role: Role) => (procs[role] = cli.start(commands[role], [...inNs(role), ...env(role)]));
    /** Whether `ip:port` takes a connection from the namespace of `from`. */
    const reachable = (from: Role, ip: string, port: number) =>
      run('ip', [...inNs(from).slice(1), 'bash', '-c', `exec 3<>/dev/tcp/${ip}/${port}`]).then(
        () => true,
        () => false,
      );

    start('temporal');
    await until('Temporal answers from the cpu namespace', () => reachable('cpu', host.temporal.ip, 7233), 60_000);
    for (const role of ['inference', 'cpu', 'trainer0', 'trainer1'] as const) start(role);

    // The workflow input, resolved where the run is planned; started from the cpu host.
    const resolved = path.join(root, 'resolved.json');
    await run(process.execPath, [
      ...[path.join(projectRoot, 'bin', 'prime-rl.js'), 'rl', '@', path.join(projectRoot, 'configs/debug/rl.toml')],
      ...['--model.name', modelDir, '--output-dir', outputDir, '--run-name', runName, '--max-steps', String(STEPS)],
      ...['--orchestrator.batch-size', '8', '--orchestrator.sampling.max-tokens', '16', '--ckpt.interval', '2'],
      ...['--orchestrator.base-urls', inferenceUrl, '--trainer.world-size', '2', '--trainer.threads', '1'],
      ...['--temporal.task-queue', queue, '--dry-run', resolved],
      ...['--temporal.heartbeat-timeout-s', String(HEARTBEAT_MS / 1000)],
    ]);
    await run('ip', [
      ...inNs('cpu').slice(1),
      ...[temporalCliPath, 'workflow', 'start', '--address', temporal, '--type', 'rl'],
      ...['--task-queue', taskQueues(queue).cpu, '--workflow-id', runName, '--input-file', resolved],
    ]);

    const metrics = RunLayout.of(outputDir, runName).metricsFile;
    const steps = () => metricSteps(metrics).length;
    // A supervisor's restart: the same command in the same namespace once the process is gone.
    const killAndRestart = async (role: Role) => {
      procs[role].child.kill('SIGKILL');
      await procs[role].exited;
      start(role);
    };
    await until('2 steps', () => steps() >= 2, 180_000);
    await killAndRestart('trainer1');
    await until('4 steps, after the trainer rank was killed', () => steps() >= 4, 180_000);
    // Killed once steps 0-3 are recorded: at most 5 are trained by then, so the rollouts of step 7
    // (policy 6) can only come from the restarted server.
    await killAndRestart('inference');

    // Partitions: each link cut for longer than the timeout that finds it (requests to the inference
    // server and activities' heartbeats: the heartbeat timeout; collectives: the trainer's), once
    // the run has trained a step since the previous fault, then restored. Nothing is restarted: the
    // run rides them out.
    for (const [a, b, timeout] of [
      ['cpu', 'inference', HEARTBEAT_MS],
      ['trainer1', 'trainer0', DIST_MS],
      ['cpu', 'temporal', HEARTBEAT_MS],
    ] as const) {
      const before = steps();
      await until(`a step before the ${a} <-> ${b} cut`, () => steps() > before, 180_000);
      await run('bash', [netns, 'cut', tag, a, b]);
      await sleep(cutMs(timeout));
      await run('bash', [netns, 'heal', tag, a, b]);
    }

    const status = async () => {
      const { stdout } = await run('ip', [
        ...inNs('cpu').slice(1),
        ...[temporalCliPath, 'workflow', 'describe', '--address', temporal, '--workflow-id', runName, '-o', 'json'],
      ]);
      return (JSON.parse(stdout) as { workflowExecutionInfo: { status: string } }).workflowExecutionInfo.status;
    };
    await until(
      'the run completes',
      async () => {
        const s = await status();
        if (/FAILED|TERMINATED|CANCELED|TIMED_OUT/.test(s)) throw new Error(`the run ended ${s}`);
        return s.includes('COMPLETED');
      },
      180_000,
    );
    checkRun(RunLayout.of(outputDir, runName), STEPS);
    // The restarted rank joined a process group of a later generation than the first.
    expect(procs.trainer1.output()).toMatch(/joining trainer process group \w+\.([2-9]|\d{2,})\b/);
    // The restarted inference server began at the base model (version 0); it serves the run's
    // latest policy now: the weights reached it before its requests.
    const { stdout } = await run('ip', [
      ...inNs('cpu').slice(1),
      ...[
        process.execPath,
        '-e',
        `fetch('http://${host.inference.ip}:8000/health').then(r => r.text()).then(console.log)`,
      ],
    ]);
    expect((JSON.parse(stdout) as { policy_version: number }).policy_version).toBeGreaterThanOrEqual(STEPS - 2);
  },
  8 * 60_000,
);
