#!/usr/bin/env bash
# The PyTorch 2.x build of the addon, checked on a CPU machine: installs PyTorch's libtorch from
# PyPI into tools/, builds the addon against it into build/torch2 (the Debian build in build/native
# stays as it is) and runs the native engine's tests on that build.
#
# PyTorch's Linux wheels on PyPI are CUDA builds. Installed without their CUDA dependencies, except
# the CUDA runtime and CUPTI that libtorch_cpu loads, their CPU half works; native/cmake/torch.cmake
# links just that half when no CUDA toolkit is found. On a GPU machine the same build reads the
# installed PyTorch (scripts/setup.sh picks it) and links all of it. The CUDA half, with our own
# kernels, is scripts/check-cuda-build.sh's.
#   bash scripts/check-torch2.sh [jest args]      default: the test/native.* files
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/torch2-pins.sh
install_pinned "$TORCH2_DIR" "${TORCH2_PINS[@]}"
echo "[check-torch2] building the addon against $TORCH2_DIR/torch into build/torch2"
LIBTORCH=$PWD/$TORCH2_DIR/torch npx --no-install cmake-js compile --directory native --out build/torch2 --log-level warn
export PRIME_NATIVE_ADDON=$PWD/build/torch2/Release/prime_native.node
node -e "console.log('[check-torch2] addon:', JSON.stringify(require(process.env.PRIME_NATIVE_ADDON).info()))"
if [ $# -eq 0 ]; then set -- test/native; fi
npx --no-install jest "$@"
