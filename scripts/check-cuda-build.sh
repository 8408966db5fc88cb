#!/usr/bin/env bash
# The CUDA build of the addon, compiled on a machine without a GPU, so that a kernel that does not
# build fails here (and in CI: .ci/run) before any time on a card is spent. Installs from PyPI into
# tools/ (pinned, idempotent: scripts/torch2-pins.sh) PyTorch 2.11+cu130, CUDA 13.0's nvcc with the
# headers and static runtime it compiles against, and the headers c10d's NCCL process group needs,
# then builds the addon against that libtorch with CUDA on into build/cuda: CUDA graphs and flash
# attention (ATen's CUDA headers), NCCL for the data-parallel trainer, and our kernels
# (native/src/cuda/*.cu, nvcc for sm_80 and sm_90), CUDA's libraries linked directly
# (native/cmake/torch.cmake, PRIME_TORCH_DIRECT). It cannot load here (cuBLAS and the other CUDA
# libraries are the GPU machine's), so the check reads the built library: every launcher of our
# kernels (native/src/cuda/kernels.h and paged_attention.h) defined in it, their device code for
# both architectures, CUDA graphs and NCCL's process group used. scripts/gpu/bundle.sh ships this
# build to a GPU machine.
#   bash scripts/check-cuda-build.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/torch2-pins.sh
install_pinned "$TORCH2_DIR" "${TORCH2_PINS[@]}"
install_pinned "$CUDA13_DIR" "${CUDA13_PINS[@]}"
install_nccl_headers
cuda=$PWD/$CUDA13_ROOT
echo "[check-cuda-build] building the addon against $TORCH2_DIR/torch with nvcc $("$cuda/bin/nvcc" --version | sed -n 's/.*release \([0-9.]*\).*/\1/p') into build/cuda"
# PRIME_REQUIRE_CUDA_KERNELS: without nvcc, or with the CUDA headers failing, the build stops
# instead of leaving the kernels out. PRIME_NCCL_INCLUDE: nccl.h's folder, the cuBLAS, cuSPARSE
# and cuSOLVER headers' (a full PyTorch install has them beside torch) and the toolkit's, for CCCL
# (cuBLAS' headers include cuda_fp16.h, which includes <nv/target>).
# -Werror=vexing-parse: `CUDAGuard guard(c10::DeviceIndex(i));` declares a function and guards
# nothing, which only a card would show. Configured every time (cmake-js compile would keep an
# earlier configuration and its flags), then built incrementally.
export CUDACXX=$cuda/bin/nvcc LIBTORCH=$PWD/$TORCH2_DIR/torch
cmake_js() { npx --no-install cmake-js "$1" --directory native --out build/cuda --log-level warn "${@:2}"; }
cmake_js configure --CDCMAKE_CXX_FLAGS=-Werror=vexing-parse --CDPRIME_TORCH_DIRECT=ON --CDPRIME_REQUIRE_CUDA_KERNELS=ON \
  "--CDPRIME_NCCL_INCLUDE=$PWD/$NCCL_HEADERS/nvidia/nccl/include;$PWD/$NCCL_HEADERS/nvidia/cu13/include;$cuda/include"
cmake_js build
lib=build/cuda/Release/prime_native.node
fail() { echo "check-cuda-build: $*" >&2; exit 1; }
# Device code for both architectures.
for arch in sm_80 sm_90; do grep -qa "$arch" "$lib" || fail "no $arch device code in $lib"; done
# Every launcher, defined (pagedDecodeAttention is declared weak: a build without it would still
# link, the engine falling back to libtorch's attention).
defined=$(nm -C --defined-only "$lib")
launchers=$(sed -n 's/^cudaError_t \([A-Za-z]*\)(.*/\1/p' native/src/cuda/kernels.h native/src/cuda/paged_attention.h)
[ -n "$launchers" ] || fail "no launcher found in native/src/cuda/kernels.h and paged_attention.h"
for fn in $launchers; do
  grep -q "prime::cuda::$fn(" <<<"$defined" || fail "prime::cuda::$fn is not defined in $lib"
done
undefined=$(nm -C --undefined-only "$lib")
grep -q "at::cuda::CUDAGraph::capture_begin" <<<"$undefined" ||
  fail "$lib does not use CUDA graphs (decode_graph.cc built without ATen's CUDA headers?)"
grep -q "c10d::ProcessGroupNCCL::ProcessGroupNCCL" <<<"$undefined" ||
  fail "$lib does not use c10d's NCCL process group (dist.cc built without PRIME_HAVE_NCCL?)"
echo "[check-cuda-build] ok: $lib ($(du -h "$lib" | cut -f1)): $(wc -w <<<"$launchers") kernel launchers for sm_80 and sm_90, CUDA graphs, NCCL"
