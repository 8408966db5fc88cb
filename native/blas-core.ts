/**
 * Which kernels OpenBLAS runs. Debian's OpenBLAS is built for every x86-64 core (DYNAMIC_ARCH) and
 * picks one from the CPU's family and model number when it is loaded. A model newer than the
 * OpenBLAS release is not recognised, and it falls back to its `Prescott` (SSE3) kernels: on an
 * Emerald Rapids Xeon (family 6, model 207) OpenBLAS 0.3.21 multiplies fp32 matrices at 48 GFLOP/s
 * on 2 cores where its SkylakeX kernels reach 290 (docs/benchmarks/compare.md). The instruction sets the CPU
 * reports are what the kernels need, so on Intel CPUs we name the core from them in
 * OPENBLAS_CORETYPE before the addon (and with it OpenBLAS) loads; OpenBLAS reads it once, at load.
 * A value the user set is kept; AMD CPUs are left to OpenBLAS's own detection (its Zen kernels).
 */
import * as fs from 'fs';

/** The OpenBLAS core for a CPU described by `/proc/cpuinfo`, or undefined to leave the choice to OpenBLAS. */
export function openBlasCoreFor(cpuinfo: string): string | undefined {
  const vendor = /^vendor_id\s*:\s*(\S+)/m.exec(cpuinfo)?.[1];
  const flags = new Set((/^flags\s*:\s*(.*)$/m.exec(cpuinfo)?.[1] ?? '').split(/\s+/));
  if (vendor !== 'GenuineIntel') return undefined;
  const has = (...names: string[]) => names.every((n) => flags.has(n));
  if (has('avx512f', 'avx512cd', 'avx512bw', 'avx512dq', 'avx512vl')) {
    return has('avx512_bf16') ? 'Cooperlake' : 'SkylakeX';
  }
  if (has('avx2', 'fma')) return 'Haswell';
  return undefined; // older cores are ones OpenBLAS knows
}

/** Sets OPENBLAS_CORETYPE for this process (and its children) unless set; returns the value in force. */
export function chooseOpenBlasCore(env: NodeJS.ProcessEnv = process.env): string | undefined {
  if (env.OPENBLAS_CORETYPE) return env.OPENBLAS_CORETYPE;
  let cpuinfo: string;
  try {
    cpuinfo = fs.readFileSync('/proc/cpuinfo', 'utf8');
  } catch {
    return undefined; // not Linux: nothing to choose from
  }
  const core = openBlasCoreFor(cpuinfo);
  if (core) env.OPENBLAS_CORETYPE = core;
  return core;
}
