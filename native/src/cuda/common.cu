// Device facts the launchers size their grids by.
#include "common.cuh"

namespace prime::cuda {

int multiprocessors() {
  // Per device, read once (a device attribute query is a driver call; launchers run often).
  static int cached[64] = {0};
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess || device < 0 || device >= 64) return 1;
  if (cached[device] == 0) {
    int n = 0;
    cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, device);
    cached[device] = n > 0 ? n : 1;
  }
  return cached[device];
}

}  // namespace prime::cuda
