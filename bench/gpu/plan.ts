/**
 * The GPU plan (issue #52): what a short window on a card runs, most important first, in two
 * commands of at most 8 minutes each (docs/gpu.md shows them with what each brings back).
 *
 *   part 1  kernels       every fused kernel against libtorch, forward and backward, fp32 and bf16,
 *                         and the paged decode kernel against libtorch's attention (kernels.md)
 *           decode        decode at 64 and 256 requests, libtorch's attention (decode.md)
 *           decode-paged  the same through the paged decode kernel, once its checks passed
 *           train         the 0.6B training step without and with the fused kernels, MFU
 *           train-fused   (train.md, train-fused.md; the fused one once the kernels' checks passed)
 *           nccl          a fully sharded group of one over NCCL (and Gloo), its collectives timed
 *   part 2  rl-size       the RL loop at size on the card (configs/gpu/rl-0.6b.toml)
 *           train-1.7b    the 1.7B shape's training step, without and with the fused kernels
 *           train-1.7b-fused
 *           serving       an RL step's generation through the server, prefix sharing off and on
 *           two-ranks     two fully sharded ranks on one card over Gloo
 *
 * Each step is a process of its own with a time limit; its result is in the output folder as soon
 * as it exists (<step>.md, its log <step>.log, and plan.md / plan.json: every step's outcome so
 * far), so a command cut short still brings back what it finished. A step is skipped, saying why,
 * when the command's deadline leaves it too little time, when it needs a check that failed, or
 * when it does not apply to the device.
 *
 *   node dist/bench/gpu/plan.js --part 1|2|all [--device cuda|cuda:N|cpu] [--out DIR]
 *     [--seconds N] [--only STEPS]
 *
 * --device cpu is the plan's dry run: the same steps on the CPU with tiny shapes (the tiny preset,
 * short prompts and rows, a few RL steps), run by the suite (test/gpu-plan.test.ts) so the plan
 * cannot rot. --seconds: the time the plan may take (default: until PRIME_GPU_DEADLINE, epoch
 * seconds, which scripts/gpu/run.sh sets from PRIME_GPU_SECONDS; else 450 a part). --only: a
 * comma-separated list of step names.
 */
import { spawn } from 'node:child_process';
import * as fs from 'node:fs';
import * as path from 'node:path';
import * as native from '../../native';
import { writeFileAtomic } from '../../lib/atomic';

/** A step's outcome. */
interface Outcome {
  step: string;
  part: number;
  status: 'pass' | 'fail' | 'timeout' | 'skip';
  seconds: number;
  detail: string;
}

interface Plan {
  device: string;
  cuda: boolean;
  out: string;
  outcomes: Outcome[];
}

interface Step {
  name: string;
  part: 1 | 2;
  what: string;
  /** Its time limit on a card (seconds); the dry run's steps get the same. */
  seconds: number;
  /** The node script (under dist/bench) and its arguments, or why the step does not apply here. */
  command(p: Plan): string[] | { skip: string };
  /** The script writes <name>.md itself (else its stdout is that file). */
  writesOwn?: boolean;
  /** Checks (substrings of their names, in kernels.json) that must have passed first. */
  needs?: string[];
}

const BENCH = path.resolve(__dirname, '..');
const script = (rel: string) => path.join(BENCH, rel);

/** The shapes of a step on a card, and of the dry run on the CPU. */
const shapes = (p: Plan) =>
  p.cuda
    ? {
        model: 'qwen3-0.6b',
        large: 'qwen3-1.7b',
        dtype: 'bfloat16',
        decode: ['--prompt', '128', '--new', '256', '--concurrency', '64,256'],
        train: ['--rows', '2', '--row-len', '4096', '--samples', '4', '--steps', '3'],
        rl: ['--steps', '12'],
        serving: ['--model', 'qwen3-0.6b'],
        threads: [] as string[],
      }
    : {
        model: 'tiny',
        large: 'tiny',
        dtype: 'float32',
        decode: ['--prompt', '16', '--new', '16', '--concurrency', '4,8'],
        train: ['--rows', '2', '--row-len', '128', '--samples', '4', '--steps', '2', '--loss-from', '8'],
        rl: ['--steps', '4', '--batch-size', '16', '--max-tokens', '16'],
        serving: ['--model', 'tiny', '--prompts', '2', '--prompt-len', '32', '--rollouts', '2', '--new', '8'],
        threads: ['--threads', '2'],
      };

const PAGED_CHECKS = "paged decode kernel equals libtorch's attention";
const FUSED_CHECKS = 'vs libtorch';

const trainStep = (name: string, part: 1 | 2, large: boolean, fused: boolean): Step => ({
  name,
  part,
  what: `the ${large ? '1.7B' : '0.6B'} training step ${fused ? 'with' : 'without'} the fused kernels (MFU)`,
  seconds: large ? (fused ? 60 : 100) : 50,
  needs: fused ? [FUSED_CHECKS] : undefined,
  command: (p) => {
    const s = shapes(p);
    return [
      script('gpu/train-step.js'),
      ...['--model', large ? s.large : s.model, '--device', p.device, '--dtype', s.dtype, ...s.train, ...s.threads],
      ...(fused ? ['--fused-kernels'] : ['--header']),
    ];
  },
});

const decodeStep = (paged: boolean): Step => ({
  name: paged ? 'decode-paged' : 'decode',
  part: 1,
  what: paged
    ? 'the same decode through the paged decode kernel'
    : "decode at 64 and 256 requests through libtorch's attention (tokens/s, roofline share)",
  seconds: paged ? 50 : 90,
  needs: paged ? [PAGED_CHECKS] : undefined,
  command: (p) => {
    if (paged && !p.cuda) return { skip: 'the paged decode kernel is CUDA code' };
    const s = shapes(p);
    return [
      script('decode.js'),
      ...['--models', s.model, '--device', p.device, '--dtype', s.dtype, ...s.decode],
      ...(paged ? ['--paged-kernel'] : s.threads),
    ];
  },
});

/** Checks of bench/gpu/checks.ts (a set, narrowed by `only`), their table in <name>.md. */
const checkStep = (name: string, part: 1 | 2, what: string, seconds: number, set: string, only?: string): Step => ({
  name,
  part,
  what,
  seconds,
  writesOwn: true,
  command: (p) => [
    script('gpu-checks.js'),
    ...['--set', set, ...(only ? ['--only', only] : []), '--device', p.device, '--out', p.out, '--file', name],
  ],
});

/**
 * The plan, in the order it runs. Qwen3.5 (issue #46) joins here when the family lands: its card
 * checks (Gated DeltaNet and gated attention against libtorch, forward and backward) as entries of
 * CHECK_SETS.kernels (bench/gpu/checks.ts), which the first step runs, and its decode and training
 * shapes as steps beside the 0.6B ones.
 */
const STEPS: Step[] = [
  checkStep(
    'kernels',
    1,
    'every fused kernel against libtorch (forward and backward, fp32 and bf16) and the paged decode kernel against libtorch attention',
    150,
    'kernels',
  ),
  decodeStep(false),
  decodeStep(true),
  trainStep('train', 1, false, false),
  trainStep('train-fused', 1, false, true),
  checkStep(
    'nccl',
    1,
    'a fully sharded group of one over NCCL and Gloo against one trainer, its collectives timed',
    40,
    'groups',
    'group of one',
  ),
  {
    name: 'rl-size',
    part: 2,
    what: 'the RL loop at size on one device (configs/gpu/rl-0.6b.toml): the step split into generation, training, weight update',
    seconds: 200,
    writesOwn: true,
    command: (p) => [
      script('rl-size.js'),
      ...['--device', p.device, ...shapes(p).rl, '--out', path.join(p.out, 'rl-size.md')],
    ],
  },
  trainStep('train-1.7b', 2, true, false),
  trainStep('train-1.7b-fused', 2, true, true),
  {
    name: 'serving',
    part: 2,
    what: "an RL step's generation through the inference server, prefix sharing off and on",
    seconds: 90,
    command: (p) => {
      const s = shapes(p);
      return [
        script('serving.js'),
        ...['--workload', 'rl', '--device', p.device, '--dtype', s.dtype, ...s.serving, ...s.threads],
      ];
    },
  },
  checkStep(
    'two-ranks',
    2,
    'two fully sharded ranks on one device over Gloo against one trainer',
    30,
    'groups',
    'two fully sharded ranks',
  ),
];

/**
 * Why a step that needs these checks (substrings of their names) must not run: the kernels step
 * did not run, one of them failed, or none of them passed (kernels.json, written as it goes).
 */
function unmet(p: Plan, needs: string[]): string | null {
  const file = path.join(p.out, 'kernels.json');
  if (!p.outcomes.some((o) => o.step === 'kernels' && o.status !== 'skip') || !fs.existsSync(file))
    return 'the kernels step did not run';
  const rows = (JSON.parse(fs.readFileSync(file, 'utf8')) as { rows: Array<{ check: string; status: string }> }).rows;
  const mine = rows.filter((r) => needs.some((n) => r.check.includes(n)));
  const failed = mine.filter((r) => r.status === 'fail').map((r) => r.check);
  if (failed.length > 0) return `its checks failed (kernels.md): ${failed.join('; ')}`;
  return mine.some((r) => r.status === 'pass') ? null : 'none of its checks passed (kernels.md)';
}

/** Runs `args` under node for at most `seconds`: stdout to `stdoutFile` (or the log), stderr to the log. */
function runStep(args: string[], seconds: number, stdoutFile: string | null, log: string) {
  return new Promise<{ code: number; timedOut: boolean }>((resolve, reject) => {
    const err = fs.openSync(log, 'w');
    const out = stdoutFile ? fs.openSync(stdoutFile, 'w') : err;
    const child = spawn(process.execPath, args, { stdio: ['ignore', out, err] });
    let timedOut = false;
    const timer = setTimeout(() => {
      timedOut = true;
      child.kill('SIGTERM');
      setTimeout(() => child.kill('SIGKILL'), 10_000).unref();
    }, seconds * 1000);
    child.on('error', reject);
    child.on('exit', (code, signal) => {
      clearTimeout(timer);
      fs.closeSync(err);
      if (out !== err) fs.closeSync(out);
      resolve({ code: code ?? (signal ? 128 : 1), timedOut });
    });
  });
}

function arg(name: string): string | undefined {
  const i = process.argv.indexOf(`--${name}`);
  if (i < 0) return undefined;
  const v = process.argv[i + 1];
  if (v === undefined || v.startsWith('--')) usage(`--${name} needs a value`);
  return v;
}
function usage(why: string): never {
  console.error(`gpu-plan: ${why}`);
  process.exit(2);
}

async function main() {
  const known = new Set(['--part', '--device', '--out', '--seconds', '--only']);
  for (let i = 2; i < process.argv.length; i += 2)
    if (!known.has(process.argv[i])) usage(`unknown argument ${process.argv[i]} (known: ${[...known].join(', ')})`);
  const part = arg('part') ?? 'all';
  if (!['1', '2', 'all'].includes(part)) usage(`--part must be 1, 2 or all, not '${part}'`);
  const info = native.info();
  const device = arg('device') ?? (info.cuda ? 'cuda' : 'cpu');
  if (!/^(cpu|cuda(:\d+)?)$/.test(device)) usage(`--device must be cpu, cuda or cuda:N, not '${device}'`);
  const only = (arg('only') ?? '').split(',').filter((x) => x !== '');
  for (const o of only)
    if (!STEPS.some((s) => s.name === o))
      usage(`--only: no step '${o}' (steps: ${STEPS.map((s) => s.name).join(', ')})`);
  const steps = STEPS.filter(
    (s) => (part === 'all' || String(s.part) === part) && (only.length === 0 || only.includes(s.name)),
  );
  const secondsArg = arg('seconds');
  const seconds = secondsArg === undefined ? NaN : Number(secondsArg);
  if (secondsArg !== undefined && !(seconds > 0)) usage(`--seconds must be a positive number, not '${secondsArg}'`);
  const start = Date.now();
  const deadline = Number.isFinite(seconds)
    ? start + seconds * 1000
    : process.env.PRIME_GPU_DEADLINE
      ? Number(process.env.PRIME_GPU_DEADLINE) * 1000
      : start + 450_000 * (part === 'all' ? 2 : 1);
  const plan: Plan = {
    device,
    cuda: device.startsWith('cuda'),
    out: path.resolve(arg('out') ?? 'outputs/gpu'),
    outcomes: [],
  };
  fs.mkdirSync(plan.out, { recursive: true });
  const header = `GPU plan, part ${part}, on ${device} (torch ${info.torchVersion}; CUDA kernels ${info.cudaKernels}, NCCL ${info.nccl}, ${info.cudaDevices} CUDA devices)`;
  const record = () => {
    const lines = [
      header,
      '',
      '| part | step | what | result | seconds | detail |',
      '| --- | --- | --- | --- | ---: | --- |',
      ...plan.outcomes.map((o) => {
        const s = STEPS.find((x) => x.name === o.step)!;
        return `| ${o.part} | ${o.step} | ${s.what} | ${o.status} | ${o.seconds.toFixed(0)} | ${o.detail.replaceAll('|', '/')} |`;
      }),
    ];
    writeFileAtomic(path.join(plan.out, 'plan.md'), lines.join('\n') + '\n');
    writeFileAtomic(
      path.join(plan.out, 'plan.json'),
      JSON.stringify({ device, info, outcomes: plan.outcomes }, null, 2) + '\n',
    );
  };
  console.log(`[gpu-plan] ${header}; ${((deadline - start) / 1000).toFixed(0)} s; results in ${plan.out}`);
  for (const step of steps) {
    const t0 = Date.now();
    const done = (status: Outcome['status'], detail: string) => {
      plan.outcomes.push({ step: step.name, part: step.part, status, seconds: (Date.now() - t0) / 1000, detail });
      record();
      console.log(`[gpu-plan] ${step.name}: ${status}${detail ? ` (${detail})` : ''}`);
    };
    const left = (deadline - Date.now()) / 1000;
    const cmd = step.command(plan);
    if (!Array.isArray(cmd)) {
      done('skip', cmd.skip);
      continue;
    }
    const why = step.needs ? unmet(plan, step.needs) : null;
    if (why) {
      done('skip', why);
      continue;
    }
    if (left < 15) {
      done('skip', `the command's time is spent (${left.toFixed(0)} s left)`);
      continue;
    }
    const limit = Math.min(step.seconds, left - 5);
    const md = path.join(plan.out, `${step.name}.md`),
      log = path.join(plan.out, `${step.name}.log`);
    const [file, ...args] = cmd;
    console.log(
      `[gpu-plan] ${step.name}: at most ${limit.toFixed(0)} s: node ${path.relative(process.cwd(), file)} ${args.join(' ')}`,
    );
    const r = await runStep(cmd, limit, step.writesOwn ? null : md, log);
    const files = [md, log].filter((f) => fs.existsSync(f) && fs.statSync(f).size > 0).map((f) => path.basename(f));
    if (r.timedOut) done('timeout', `stopped after ${limit.toFixed(0)} s; ${files.join(', ')}`);
    else done(r.code === 0 ? 'pass' : 'fail', `exit ${r.code}; ${files.join(', ')}`);
  }
  const failed = plan.outcomes.filter((o) => o.status === 'fail' || o.status === 'timeout');
  console.log(`[gpu-plan] done in ${((Date.now() - start) / 1000).toFixed(0)} s: ${plan.out}/plan.md`);
  process.exit(failed.length > 0 ? 1 : 0);
}

main().catch((e: unknown) => {
  console.error(e);
  process.exit(1);
});
