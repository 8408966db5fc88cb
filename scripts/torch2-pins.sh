# Sourced by the scripts that build the addon against PyTorch 2.x on a machine without a GPU
# (scripts/check-torch2.sh, scripts/check-cuda-build.sh, scripts/gpu/bundle.sh): what they install
# from PyPI into tools/, pinned, and the idempotent install itself.
# The PyTorch of the GPU machines we test on, and the CUDA runtime pins of that wheel; plus CUDA
# 13.0's crt/ headers, which the runtime's headers include (ATen's CUDA headers need both).
TORCH2_DIR=tools/torch2
TORCH2_PINS=(torch==2.11.0 nvidia-cuda-runtime==13.0.96 nvidia-cuda-cupti==13.0.85 nvidia-cuda-crt==13.0.88)
# CUDA 13.0's compiler, at the versions torch 2.11+cu130 pins (its cuda-toolkit==13.0.2): nvcc, its
# device front end (nvvm: cicc, libdevice), the runtime's headers and static library, crt/ headers
# and CCCL (cub, thrust, libcu++). One toolkit tree: $CUDA13_DIR/nvidia/cu13.
CUDA13_DIR=tools/cuda13
CUDA13_PINS=(nvidia-cuda-nvcc==13.0.88 nvidia-nvvm==13.0.88 nvidia-cuda-runtime==13.0.96 nvidia-cuda-crt==13.0.88
  nvidia-cuda-cccl==13.0.85)
CUDA13_ROOT=$CUDA13_DIR/nvidia/cu13

# install_pinned DIR PIN...: DIR holds exactly these pins (DIR/.pins), else it is installed anew,
# beside it first and then renamed (an interrupted install leaves no half-filled DIR).
install_pinned() {
  local dir=$1
  shift
  if [ -f "$dir/.pins" ] && [ "$(cat "$dir/.pins")" = "$*" ]; then return; fi
  echo "[torch2-pins] installing $* into $dir"
  rm -rf "$dir.tmp"
  python3 -m pip install --quiet --disable-pip-version-check --no-deps --no-compile --target "$dir.tmp" "$@"
  # nvcc's profile (bin/nvcc.profile) looks for the runtime's libraries in lib64; the wheels have lib/.
  if [ -d "$dir.tmp/nvidia/cu13/bin" ] && [ ! -e "$dir.tmp/nvidia/cu13/lib64" ]; then ln -s lib "$dir.tmp/nvidia/cu13/lib64"; fi
  echo "$*" > "$dir.tmp/.pins"
  rm -rf "$dir" && mv "$dir.tmp" "$dir"
}
