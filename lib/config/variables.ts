/**
 * The environment variables named `PRIME_*` that are not config. Every other `PRIME_*` variable is
 * config (`PRIME_TRAINER__OPTIM__LR=1e-5` sets trainer.optim.lr: loader.ts), and one that no
 * command has a key for is refused by name, never ignored: the prefix belongs to the config and to
 * these. (A variable a config names by `api_key_var` is the user's own: it must not start with
 * `PRIME_`.) test/unit/config.test.ts checks that the code reads no other.
 */

/** Variables by name, with what reads them. */
export const FRAMEWORK_VARIABLES: Readonly<Record<string, string>> = {
  PRIME_SETUP: 'lib/optional-parts.ts: 0 = this machine installs nothing at run time',
  PRIME_WANDB_PYTHON: 'lib/run-ops/wandb.ts: the Python with the wandb package',
  PRIME_NATIVE_ADDON: 'native/index.ts: another build of the addon',
  PRIME_RL_PARENT_PIPE_FD: "lib/proc.ts: the launcher's pipe a child process watches",
  PRIME_RL_NO_API_KEY: 'lib/orchestrator/verifiers-rollout.ts: the (unset) key variable of a server without a key',
  PRIME_RL_VERIFIERS: 'scripts/setup.sh: 0 leaves the verifiers venv out',
  PRIME_TEMPORAL_FROM_SOURCE: 'scripts/setup.sh: 1 builds the Temporal CLI from Go source',
  PRIME_RL_VERIFIERS_PYTHON: "test/verifiers.env.test.ts: the verifiers venv's Python",
  PRIME_PYTHON: 'bench/gpu-checks.ts: the Python with torch and transformers',
  PRIME_NETNS_NET: "scripts/netns.sh: the test namespaces' network",
  PRIME_NODE_INCLUDE: "scripts/gpu/run.sh: Node's headers on a GPU machine",
};

/** Families of variables by prefix, with what reads them. */
export const FRAMEWORK_PREFIXES: Readonly<Record<string, string>> = {
  PRIME_BENCH_: 'bench/: benchmark settings',
  PRIME_GPU_: 'scripts/gpu/ and test/gpu/: GPU session settings',
};

export function isFrameworkVariable(name: string): boolean {
  return Object.hasOwn(FRAMEWORK_VARIABLES, name) || Object.keys(FRAMEWORK_PREFIXES).some((p) => name.startsWith(p));
}
