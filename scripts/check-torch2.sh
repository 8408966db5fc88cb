#!/usr/bin/env bash
# The PyTorch 2.x build of the addon, checked on a CPU machine: installs PyTorch's libtorch from
# PyPI into tools/, builds the addon against it into build/torch2 (the Debian build in build/native
# stays as it is) and runs the native engine's tests on that build.
#
# PyTorch's Linux wheels on PyPI are CUDA builds. Installed without their CUDA dependencies, except
# the CUDA runtime and CUPTI that libtorch_cpu loads, their CPU half works; native/cmake/torch.cmake
# links just that half when no CUDA toolkit is found. On a GPU machine the same build reads the
# installed PyTorch (scripts/setup.sh picks it) and links all of it.
#   bash scripts/check-torch2.sh [jest args]      default: the test/native.* files
set -euo pipefail
cd "$(dirname "$0")/.."
# The PyTorch of the GPU machines we test on, and the CUDA runtime pins of that wheel; plus CUDA
# 13.0's crt/ headers, which the runtime's headers include (ATen's CUDA headers need both: the
# bundle's prebuilt addon compiles its CUDA graphs with them, scripts/gpu/bundle.sh).
TORCH_PINS=(torch==2.11.0 nvidia-cuda-runtime==13.0.96 nvidia-cuda-cupti==13.0.85 nvidia-cuda-crt==13.0.88)
dir=tools/torch2
if [ ! -f "$dir/.pins" ] || [ "$(cat "$dir/.pins")" != "${TORCH_PINS[*]}" ]; then
  echo "[check-torch2] installing ${TORCH_PINS[*]} into $dir (about 1 GB)"
  rm -rf "$dir"
  python3 -m pip install --quiet --no-deps --no-compile --target "$dir" "${TORCH_PINS[@]}"
  echo "${TORCH_PINS[*]}" > "$dir/.pins"
fi
echo "[check-torch2] building the addon against $dir/torch into build/torch2"
LIBTORCH=$PWD/$dir/torch npx --no-install cmake-js compile --directory native --out build/torch2 --log-level warn
export PRIME_NATIVE_ADDON=$PWD/build/torch2/Release/prime_native.node
node -e "console.log('[check-torch2] addon:', JSON.stringify(require(process.env.PRIME_NATIVE_ADDON).info()))"
if [ $# -eq 0 ]; then set -- test/native; fi
npx --no-install jest "$@"
