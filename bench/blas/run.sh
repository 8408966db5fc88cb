#!/usr/bin/env bash
# The fp32 GEMM rates of OpenBLAS, oneDNN and PyTorch per CPU second (bench/blas/sgemm_cpu_time.cc):
#   bash bench/blas/run.sh [threads] [python with torch]   (default: 1, build/bench-venv/bin/python)
set -euo pipefail
cd "$(dirname "$0")/../.."
threads=${1:-1}
py=${2:-build/bench-venv/bin/python}
lib=/usr/lib/x86_64-linux-gnu
mkdir -p build/bench-blas
g++ -O2 -fopenmp bench/blas/sgemm_cpu_time.cc -o build/bench-blas/sgemm_cpu_time "$lib/libdnnl.so.2" "$lib/libopenblas.so.0"
echo "OpenBLAS core: $(OPENBLAS_VERBOSE=2 build/bench-blas/sgemm_cpu_time 1 2>&1 >/dev/null | grep -o 'Core: .*' | head -1 || true)"
build/bench-blas/sgemm_cpu_time "$threads"
if [ -x "$py" ]; then "$py" bench/blas/sgemm_cpu_time_torch.py "$threads"; else echo "(no $py: PyTorch's side skipped)"; fi
