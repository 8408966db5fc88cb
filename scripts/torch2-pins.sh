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

# The headers c10d's NCCL process group needs beside torch's (nccl.h, and cuBLAS', cuSPARSE's and
# cuSOLVER's, which its CUDA context header includes), from those packages' wheels at the versions
# torch 2.11 uses, headers only (about 1.2 GB of downloads, once): NCCL_HEADERS/nvidia/*/include.
# scripts/check-cuda-build.sh builds the addon with NCCL against them, check-nccl-compile.sh
# compiles the NCCL code against them.
NCCL_HEADERS=tools/nccl-headers
NCCL_HEADER_PINS=(nvidia-nccl-cu13==2.28.9 nvidia-cublas==13.0.2.14 nvidia-cusparse==12.9.4.2 nvidia-cusolver==12.4.1.2)
install_nccl_headers() {
  if [ "$(cat "$NCCL_HEADERS/.pins" 2>/dev/null)" = "${NCCL_HEADER_PINS[*]}" ]; then return; fi
  echo "[torch2-pins] downloading ${NCCL_HEADER_PINS[*]} (headers only are kept)"
  rm -rf "$NCCL_HEADERS.tmp" && mkdir -p "$NCCL_HEADERS.tmp/wheels"
  python3 -m pip download --quiet --disable-pip-version-check --no-deps -d "$NCCL_HEADERS.tmp/wheels" "${NCCL_HEADER_PINS[@]}"
  python3 - "$NCCL_HEADERS.tmp" "$NCCL_HEADERS.tmp"/wheels/*.whl <<'PY'
import re, sys, zipfile
for wheel in sys.argv[2:]:
    with zipfile.ZipFile(wheel) as z:
        z.extractall(sys.argv[1], [n for n in z.namelist() if re.match(r"nvidia/[^/]+/include/", n)])
PY
  rm -rf "$NCCL_HEADERS.tmp/wheels"
  echo "${NCCL_HEADER_PINS[*]}" > "$NCCL_HEADERS.tmp/.pins"
  rm -rf "$NCCL_HEADERS" && mv "$NCCL_HEADERS.tmp" "$NCCL_HEADERS"
}
