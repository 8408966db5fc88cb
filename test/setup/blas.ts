/**
 * Jest global set-up: the OpenBLAS core for this CPU (native/blas-core.ts) in the real environment
 * of the test process. The facade sets it itself before loading the addon, but a test file's
 * `process.env` is Jest's copy, which OpenBLAS (reading the C environment when the addon loads)
 * never sees.
 */
import { chooseOpenBlasCore } from '../../native/blas-core';

export default function setup(): void {
  chooseOpenBlasCore();
}
