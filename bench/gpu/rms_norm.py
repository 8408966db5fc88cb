"""RMSNorm forward + backward on the shapes of a Qwen3-0.6B training step, three ways, for the
choice the H200 profile left open (docs/benchmarks/gpu.md): libtorch's fused RMSNorm computes
the weight's gradient in GammaBetaBackward, the step's largest kernel (17 ms over 226 calls), where
PyTorch's loop over HF's eager norm gets it from a plain sum (9 ms).

  python3 bench/gpu/rms_norm.py [--device cuda] [--tokens 4096] [--iters 50]

  fused        torch._fused_rms_norm(x, [d], w): what the engine runs on CUDA today
  fused+mul    torch._fused_rms_norm(x, [d], None) * w: the weight's gradient as a mul and a sum
  eager        HF's Qwen3RMSNorm: fp32 variance, rsqrt, cast back, times the weight

x is bf16 (the activations under mixed precision), w an fp32 master weight cast to bf16 (its
gradient returns in fp32), as in the engine. Per row of --tokens tokens a step runs 57 norms of
width 1024 (28 layers x 2 + the final one) and 28 each of the q and k norms (width 128, over
16 and 8 heads); a step of 2 rows runs each twice. Prints microseconds per call and the step's
total, per way.
"""
import argparse
import time

import torch

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, LAYERS, EPS = 1024, 16, 8, 128, 28, 1e-6


def norm(way: str, x: torch.Tensor, w32: torch.Tensor) -> torch.Tensor:
    w = w32.to(x.dtype)
    d = x.shape[-1]
    if way == "fused":
        return torch._fused_rms_norm(x, [d], w, EPS)[0]
    if way == "fused+mul":
        return torch._fused_rms_norm(x, [d], None, EPS)[0] * w
    xf = x.float()
    return w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + EPS)).to(x.dtype)


def time_us(way: str, rows: int, d: int, device: str, iters: int) -> float:
    x = torch.randn(rows, d, device=device, dtype=torch.bfloat16, requires_grad=True)
    w32 = torch.ones(d, device=device, requires_grad=True)
    g = torch.randn(rows, d, device=device, dtype=torch.bfloat16)

    def once() -> None:
        x.grad = w32.grad = None
        norm(way, x, w32).backward(g)

    for _ in range(3):
        once()
    cuda = device.startswith("cuda")
    if cuda:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
    else:
        t0 = time.perf_counter()
    for _ in range(iters):
        once()
    if cuda:
        end.record()
        torch.cuda.synchronize()  # deliberate: the one read of the timing
        return start.elapsed_time(end) * 1e3 / iters
    return (time.perf_counter() - t0) * 1e6 / iters


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    ap.add_argument("--tokens", type=int, default=4096)
    ap.add_argument("--iters", type=int, default=50)
    ap.add_argument("--rows-per-step", type=int, default=2)
    a = ap.parse_args()
    n = a.tokens
    shapes = [  # (label, rows, width, calls per row)
        ("hidden", n, HIDDEN, 2 * LAYERS + 1),
        ("q", n * HEADS, HEAD_DIM, LAYERS),
        ("k", n * KV_HEADS, HEAD_DIM, LAYERS),
    ]
    ways = ["fused", "fused+mul", "eager"]
    print(f"torch {torch.__version__}, {a.device}, {n} tokens a row, {a.rows_per_step} rows a step, bf16")
    print("| norm | rows x width | " + " | ".join(f"{w} us" for w in ways) + " |")
    print("|---|---|" + "---:|" * len(ways))
    total = {w: 0.0 for w in ways}
    for label, rows, d, calls in shapes:
        us = {w: time_us(w, rows, d, a.device, a.iters) for w in ways}
        for w in ways:
            total[w] += us[w] * calls * a.rows_per_step
        print(f"| {label} | {rows} x {d} | " + " | ".join(f"{us[w]:.1f}" for w in ways) + " |")
    print("| a step (ms) | | " + " | ".join(f"{total[w] / 1e3:.2f}" for w in ways) + " |")


if __name__ == "__main__":
    main()
