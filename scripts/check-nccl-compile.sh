#!/usr/bin/env bash
# Compiles the addon's NCCL code (c10d's ProcessGroupNCCL, behind PRIME_HAVE_NCCL) on a machine
# without a GPU, syntax only, with -Wall -Werror: stricter than the CUDA build check
# (check-cuda-build.sh, which builds with NCCL too), and quick. c10d's NCCL header needs nccl.h and
# the cuBLAS, cuSPARSE and cuSOLVER headers, which only a full PyTorch install has: this takes the
# headers alone from those packages' wheels (torch2-pins.sh's install_nccl_headers, about 1.2 GB of
# downloads once) and compiles every source that includes dist.h with NCCL on, against torch
# 2.11's headers.
#   bash scripts/check-nccl-compile.sh
set -euo pipefail
cd "$(dirname "$0")/.."
source scripts/torch2-pins.sh
install_pinned "$TORCH2_DIR" "${TORCH2_PINS[@]}"
install_pinned "$CUDA13_DIR" "${CUDA13_PINS[@]}"
install_nccl_headers
HEADERS=$NCCL_HEADERS
torch=$TORCH2_DIR/torch
includes=(-Inative/src -I"$(node -p 'require("node:path").join(process.execPath, "../../include/node")')"
  -Inode_modules/node-addon-api -isystem "$TORCH2_DIR/nvidia/cu13/include" -isystem "$torch/include"
  -isystem "$torch/include/torch/csrc/api/include" -isystem "$CUDA13_ROOT/include"
  -isystem "$HEADERS/nvidia/nccl/include" -isystem "$HEADERS/nvidia/cu13/include")
defines=(-DNAPI_VERSION=8 -DNODE_ADDON_API_CPP_EXCEPTIONS -DPRIME_HAVE_CUDA -DPRIME_HAVE_GLOO -DUSE_C10D_GLOO
  -DUSE_DISTRIBUTED -DUSE_C10D_NCCL -DPRIME_HAVE_NCCL)
files=$(grep -l '#include "\(\.\./\)\?dist\.h"' native/src/*.cc native/src/addon/*.cc)
for f in $files; do
  echo "[check-nccl-compile] $f"
  c++ -std=gnu++17 -fsyntax-only -Wall -Werror -Wno-unused-parameter -Wno-interference-size "${defines[@]}" "${includes[@]}" "$f"
done
echo "[check-nccl-compile] ok: $(echo "$files" | wc -w) sources compile with c10d's NCCL process group"
