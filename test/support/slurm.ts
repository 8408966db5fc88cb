/**
 * A real SLURM cluster of one node on this machine, for test/slurm.test.ts: Debian's slurm-wlm
 * (slurmctld, slurmd) with munge, each started by the test from a folder of its own (key, config,
 * state, spool, logs) on free ports, with `SLURM_CONF` pointing the commands at it; nothing of the
 * machine's own configuration is read or changed. `stop` cancels what runs and ends the daemons.
 */
import { execFileSync, spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import * as fs from 'node:fs';
import * as os from 'node:os';
import * as path from 'node:path';
import { freePort } from '../../lib/net';
import { cmdline, isRunning, until } from './processes';

const DAEMONS = ['munged', 'slurmctld', 'slurmd', 'sbatch', 'srun', 'squeue', 'scancel'];

/** Why a cluster cannot be started here, or undefined when it can. */
export function slurmUnusable(): string | undefined {
  if (process.getuid?.() !== 0) return 'not root (slurmd runs jobs as their users; munge and slurm want root here)';
  const missing = DAEMONS.filter((d) => spawnSync('sh', ['-c', `command -v ${d}`]).status !== 0);
  if (missing.length > 0)
    return `${missing.join(', ')} not installed (bash scripts/setup.sh --tests installs slurm-wlm)`;
  return undefined;
}

export interface SlurmCluster {
  /** The environment the SLURM commands need (SLURM_CONF), over this process's. */
  env: NodeJS.ProcessEnv;
  partition: string;
  run(cmd: string, args: string[]): string;
  /** Cancels what runs and ends the daemons; resolves once none of them runs. */
  stop(): Promise<void>;
}

export async function startSlurm(dir: string): Promise<SlurmCluster> {
  const munge = path.join(dir, 'munge');
  fs.mkdirSync(munge, { recursive: true, mode: 0o700 });
  for (const d of ['state', 'spool', 'log']) fs.mkdirSync(path.join(dir, d), { recursive: true });
  const key = path.join(munge, 'munge.key');
  fs.writeFileSync(key, randomBytes(1024), { mode: 0o400 });
  const socket = path.join(munge, 'sock');
  execFileSync('munged', [
    '--force',
    `--key-file=${key}`,
    `--socket=${socket}`,
    `--pid-file=${path.join(munge, 'pid')}`,
    `--log-file=${path.join(munge, 'log')}`,
    `--seed-file=${path.join(munge, 'seed')}`,
  ]);
  const host = os.hostname().split('.')[0]!;
  const memMb = Math.floor(os.totalmem() / 2 ** 20 / 2);
  const conf = path.join(dir, 'slurm.conf');
  fs.writeFileSync(
    conf,
    [
      'ClusterName=prime',
      `SlurmctldHost=${host}`,
      `SlurmctldPort=${await freePort()}`,
      `SlurmdPort=${await freePort()}`,
      'SlurmUser=root',
      'SlurmdUser=root',
      'AuthType=auth/munge',
      `AuthInfo=socket=${socket}`,
      'CredType=cred/munge',
      `StateSaveLocation=${path.join(dir, 'state')}`,
      `SlurmdSpoolDir=${path.join(dir, 'spool')}`,
      `SlurmctldPidFile=${path.join(dir, 'slurmctld.pid')}`,
      `SlurmdPidFile=${path.join(dir, 'slurmd.pid')}`,
      `SlurmctldLogFile=${path.join(dir, 'log', 'slurmctld.log')}`,
      `SlurmdLogFile=${path.join(dir, 'log', 'slurmd.log')}`,
      // No cgroups in a container: processes tracked by their parents, no task binding.
      'ProctrackType=proctrack/linuxproc',
      'TaskPlugin=task/none',
      'SelectType=select/cons_tres',
      'SelectTypeParameters=CR_Core',
      'SchedulerType=sched/builtin',
      'ReturnToService=2',
      'MpiDefault=none',
      'JobCompType=jobcomp/none',
      'AccountingStorageType=accounting_storage/none',
      'JobAcctGatherType=jobacct_gather/none',
      'KillWait=15',
      `NodeName=${host} NodeAddr=127.0.0.1 CPUs=${os.cpus().length} RealMemory=${memMb} State=UNKNOWN`,
      'PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE',
      '',
    ].join('\n'),
  );
  const env = { ...process.env, SLURM_CONF: conf };
  const run = (cmd: string, args: string[]) => execFileSync(cmd, args, { env, encoding: 'utf8', timeout: 30_000 });
  const pidOf = (file: string) => {
    try {
      return Number(fs.readFileSync(path.join(dir, file), 'utf8').trim());
    } catch {
      return undefined;
    }
  };
  // Ends the cluster and returns once nothing of it runs, so the folder can be removed: slurmctld
  // saves its state as it exits and a job step's slurmstepd writes the spool until it ends.
  const stop = async () => {
    try {
      run('scancel', ['--full', '--partition', 'debug']);
    } catch {
      // no controller: nothing runs
    }
    const daemons = ['slurmd.pid', 'slurmctld.pid', 'munge/pid'].map(pidOf).filter((p): p is number => !!p);
    const ours = () => [...daemons, ...stepDaemons()].filter(isRunning);
    signal(daemons, 'SIGTERM');
    try {
      await until('the SLURM daemons and job steps to exit', () => ours().length === 0, 30_000);
    } catch {
      signal(ours(), 'SIGKILL');
      await until('the SLURM daemons to die', () => ours().length === 0, 10_000);
    }
  };
  try {
    run('slurmctld', ['-i', '-f', conf]);
    run('slurmd', ['-f', conf]);
    await until('the SLURM node idle', () => /idle/.test(run('sinfo', ['-h', '-o', '%T'])), 60_000);
  } catch (e) {
    await stop();
    throw e;
  }
  return { env, partition: 'debug', run, stop };
}

/** The slurmstepd processes on this machine: only the test's cluster starts any. */
function stepDaemons(): number[] {
  return fs
    .readdirSync('/proc')
    .filter((d) => /^\d+$/.test(d))
    .map(Number)
    .filter((pid) => cmdline(pid).startsWith('slurmstepd'));
}

function signal(pids: number[], sig: NodeJS.Signals): void {
  for (const pid of pids)
    try {
      process.kill(pid, sig);
    } catch {
      // gone
    }
}
