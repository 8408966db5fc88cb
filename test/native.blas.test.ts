/**
 * OpenBLAS's kernels: named from the CPU's instruction sets on Intel (native/blas-core.ts), so that
 * a CPU newer than the OpenBLAS release does not fall back to its SSE3 kernels.
 */
import * as fs from 'node:fs';
import { openBlasCoreFor } from '../native/blas-core';
import { info } from '../native';

const cpu = (vendor: string, flags: string) => `processor\t: 0\nvendor_id\t: ${vendor}\nflags\t\t: ${flags}\n`;
const AVX512 = 'fpu sse2 avx avx2 fma avx512f avx512cd avx512bw avx512dq avx512vl';

test('the core is named from the instruction sets on Intel, left to OpenBLAS elsewhere', () => {
  expect(openBlasCoreFor(cpu('GenuineIntel', `${AVX512} avx512_bf16 amx_tile`))).toBe('Cooperlake');
  expect(openBlasCoreFor(cpu('GenuineIntel', AVX512))).toBe('SkylakeX');
  expect(openBlasCoreFor(cpu('GenuineIntel', 'fpu sse2 avx avx2 fma'))).toBe('Haswell');
  // AVX-512 foundation alone (Knights Landing) lacks the subsets SkylakeX kernels use.
  expect(openBlasCoreFor(cpu('GenuineIntel', 'fpu sse2 avx avx2 fma avx512f avx512cd'))).toBe('Haswell');
  expect(openBlasCoreFor(cpu('GenuineIntel', 'fpu sse2 avx'))).toBeUndefined();
  expect(openBlasCoreFor(cpu('AuthenticAMD', `${AVX512} avx512_bf16`))).toBeUndefined();
  expect(openBlasCoreFor('')).toBeUndefined();
});

test('the engine runs the kernels chosen for this CPU', () => {
  const { blasCore } = info();
  if (blasCore === undefined) return; // libtorch's BLAS is not OpenBLAS (MKL in PyTorch 2.x builds)
  const chosen = process.env.OPENBLAS_CORETYPE ?? openBlasCoreFor(fs.readFileSync('/proc/cpuinfo', 'utf8'));
  if (chosen !== undefined) expect(blasCore.toLowerCase()).toBe(chosen.toLowerCase());
  else expect(blasCore).not.toBe('Prescott');
});
