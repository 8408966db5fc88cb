/**
 * The engine's process-wide settings and facts: what the build has (libtorch, CUDA, BLAS, Gloo,
 * NCCL), compute threads, and the CPU caching allocator (native/src/addon/functions.cc).
 */
import { loadAddon } from './addon';

export interface NativeInfo {
  torchVersion: string;
  cuda: boolean;
  /** ATen (OpenMP) intra-op threads. */
  threads: number;
  /** OpenBLAS's own thread pool size, when libtorch uses OpenBLAS. */
  blasThreads?: number;
  /** The kernels OpenBLAS runs (`openblas_get_corename`), when libtorch's BLAS is OpenBLAS. */
  blasCore?: string;
  /** The library file that defines the BLAS sgemm_ ATen calls (Debian: libblas.so.3, OpenBLAS behind it). */
  blas?: string;
  /** The instruction set of the engine's own CPU loops (native/src/cpu_kernels.h): default, avx2, avx512. */
  cpuKernels: string;
  /** Whether the CPU multiplies bf16 itself (AVX-512 BF16 or AMX): bf16 matmuls then run in bf16. */
  cpuBf16Dot: boolean;
  parallelInfo: string;
  /** Whether the build has c10d's Gloo process group (the data-parallel trainer, `createGroup`). */
  gloo: boolean;
  /** Whether the build has our fused CUDA kernels (`ModelOptions.fusedKernels` on CUDA). */
  cudaKernels: boolean;
  /** Whether the build has c10d's NCCL process group (PyTorch 2.x with CUDA): `trainer.dist.backend`. */
  nccl: boolean;
  /**
   * Whether the trainer's store listens on `trainer.dist.host` only (PyTorch >= 2.2); libtorch
   * 1.13's listens on every interface, and lib/trainer/group.ts's signatures are what guard it.
   */
  storeBindsHost: boolean;
  /** CUDA devices the addon sees (0 without CUDA). */
  cudaDevices: number;
}

/** The CPU caching allocator's counters (native/src/cpu_cache.h): large blocks reused or newly allocated. */
export interface CpuCacheStats {
  hits: number;
  misses: number;
  cachedBytes: number;
  capacityBytes: number;
}

interface ProcessAddon {
  info(): NativeInfo;
  setThreads(n: number): void;
  setCpuCache(capacityBytes: number): void;
  cpuCacheStats(): CpuCacheStats;
}
const addon = () => loadAddon<ProcessAddon>();

/** libtorch version, CUDA availability and the intra-op thread count. */
export function info(): NativeInfo {
  return addon().info();
}

/**
 * Uses `n` threads for every later compute call. With a pthreads OpenBLAS (Debian libtorch) the
 * matmuls get n threads and ATen's OpenMP pool 1, as the two pools would fight over the cores.
 */
export function setThreads(n: number): void {
  addon().setThreads(n);
}

/**
 * How many bytes of freed large CPU tensors (1 MiB and more) the engine keeps for reuse: 2 GiB
 * unless set. A step re-allocates the same large buffers (logits chunks, gradients), which would
 * otherwise go back to the kernel and be faulted in and zeroed again. 0 turns the cache off.
 */
export function setCpuCache(capacityBytes: number): void {
  addon().setCpuCache(capacityBytes);
}

export function cpuCacheStats(): CpuCacheStats {
  return addon().cpuCacheStats();
}
