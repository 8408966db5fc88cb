#!/usr/bin/env bash
# The CUDA build of the addon, compiled on a machine without a GPU, so that a kernel that does not
# build fails here (and in CI: .ci/run) before any time on a card is spent. Installs from PyPI into
# tools/ (pinned, idempotent: scripts/torch2-pins.sh) PyTorch 2.11+cu130 and CUDA 13.0's nvcc with
# the headers and static runtime it compiles against, then builds the addon against that libtorch
# with CUDA on into build/cuda: CUDA graphs and flash attention (ATen's CUDA headers) and our fused
# kernels (native/src/cuda/*.cu, nvcc for sm_80 and sm_90), CUDA's libraries linked directly
# (native/cmake/torch.cmake, PRIME_TORCH_DIRECT). It cannot load here (cuBLAS and the other CUDA
# libraries are the GPU machine's), so the check reads the built library: the kernels' launchers
# and their device code must be in it. scripts/gpu/bundle.sh ships this build to a GPU machine.
#   bash scripts/check-cuda-build.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/torch2-pins.sh
install_pinned "$TORCH2_DIR" "${TORCH2_PINS[@]}"
install_pinned "$CUDA13_DIR" "${CUDA13_PINS[@]}"
cuda=$PWD/$CUDA13_ROOT
echo "[check-cuda-build] building the addon against $TORCH2_DIR/torch with nvcc $("$cuda/bin/nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p') into build/cuda"
# PRIME_REQUIRE_CUDA_KERNELS: without nvcc, or with the CUDA headers failing, the build stops
# instead of leaving the kernels out.
CUDACXX=$cuda/bin/nvcc LIBTORCH=$PWD/$TORCH2_DIR/torch npx --no-install cmake-js compile --directory native \
  --out build/cuda --log-level warn --CDPRIME_TORCH_DIRECT=ON --CDPRIME_REQUIRE_CUDA_KERNELS=ON
lib=build/cuda/Release/prime_native.node
# Device code for both architectures, and every launcher of native/src/cuda/kernels.h.
for arch in sm_80 sm_90; do
  grep -qa "$arch" "$lib" || { echo "check-cuda-build: no $arch device code in $lib" >&2; exit 1; }
done
symbols=$(nm -C --defined-only "$lib")
for fn in rmsNormForward rmsNormBackward rmsNormWeightGrad rope swigluForward swigluBackward lmHeadForward lmHeadBackward; do
  grep -q "prime::cuda::$fn(" <<<"$symbols" || { echo "check-cuda-build: prime::cuda::$fn is not in $lib" >&2; exit 1; }
done
grep -q "at::cuda::CUDAGraph::capture_begin" <<<"$(nm -C --undefined-only "$lib")" ||
  { echo "check-cuda-build: $lib does not use CUDA graphs (decode_graph.cc built without ATen's CUDA headers?)" >&2; exit 1; }
echo "[check-cuda-build] ok: $lib ($(du -h "$lib" | cut -f1)): fused kernels for sm_80 and sm_90, CUDA graphs"
