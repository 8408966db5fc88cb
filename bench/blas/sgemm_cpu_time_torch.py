"""PyTorch's fp32 GEMM rate per CPU second on bench/blas/sgemm_cpu_time.cc's products (x w^T as
torch.nn.functional.linear runs them, and the backward's dX = g w and dW = g^T x), one thread."""
import sys
import time

import torch

torch.set_num_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
SHAPES = [("fwd q/k/v", "NT", 1024, 1024, 512), ("fwd o", "NT", 1024, 512, 512), ("fwd gate/up", "NT", 1024, 2560, 512),
          ("fwd down", "NT", 1024, 512, 1280), ("dX gate/up", "NN", 1024, 512, 2560), ("dW gate/up", "TN", 2560, 512, 1024),
          ("dX down", "NN", 1024, 1280, 512), ("dW down", "TN", 512, 1280, 1024), ("decode q/k/v", "NT", 64, 1024, 512),
          ("decode gate/up", "NT", 64, 2560, 512)]
print(f"torch {torch.__version__}, {torch.get_num_threads()} thread(s); GFLOP per CPU second")
print("| product | M | N | K | PyTorch |\n|---|---:|---:|---:|---:|")
for name, op, m, n, k in SHAPES:
    a = torch.randn(k, m).t() if op[0] == "T" else torch.randn(m, k)
    b = torch.randn(n, k).t() if op[1] == "T" else torch.randn(k, n)
    for _ in range(3):
        a @ b
    iters, t0 = 0, time.process_time()
    while time.process_time() - t0 < 1.0:
        a @ b
        iters += 1
    print(f"| {name} | {m} | {n} | {k} | {2 * m * n * k * iters / (time.process_time() - t0) / 1e9:.1f} |")
