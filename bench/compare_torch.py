"""The PyTorch side of bench/compare.ts: Hugging Face transformers + PyTorch eager on a model
folder, one workload per process (so ru_maxrss is that workload's peak). Prints one JSON line.

  python bench/compare_torch.py <model dir> decode <batch> <threads>
  python bench/compare_torch.py <model dir> train <rows> <row length> <threads>
  python bench/compare_torch.py - gemm <m,k,n;m,k,n;...> <threads>

decode: <batch> random prompts of PRIME_BENCH_PROMPT tokens (64), PRIME_BENCH_NEW sampled tokens
each (64; temperature 1, no top-k/top-p, no early stop), prefill included. train: the engine's
packed rows of PRIME_BENCH_SAMPLES (4) samples each, here a batch of samples * <rows> sequences of
<row length> / samples tokens (the same attention work: a packed row attends within each sample),
CE on tokens PRIME_BENCH_LOSS_FROM.. (32) of each sample, backward, clip to norm 1, AdamW. gemm:
torch.nn.functional.linear(x [m, k], w [n, k]) in PRIME_BENCH_DTYPE for each shape, GFLOP/s (the
engine's side: native linearGflops).

PRIME_BENCH_DEVICE (cpu) and PRIME_BENCH_DTYPE (float32) as the engine's: on CUDA, timings wait for
the device (synchronize), decode runs in bf16 weights and training in bf16 mixed precision, by
PRIME_BENCH_TORCH_MIXED: "autocast" (default: fp32 weights, torch.autocast; activations between the
matmuls stay fp32) or "master" (the engine trainer's scheme and FSDP2's MixedPrecisionPolicy with
param_dtype bf16: the model in bf16, so every activation is bf16, with fp32 master weights, fp32
gradients and fp32 AdamW state; each step casts the bf16 gradients up and the updated weights down).
"""
import json
import os
import resource
import sys
import time

import torch
import transformers
from transformers import AutoModelForCausalLM

PROMPT = int(os.environ.get("PRIME_BENCH_PROMPT", "64"))
NEW = int(os.environ.get("PRIME_BENCH_NEW", "64"))
SAMPLES = int(os.environ.get("PRIME_BENCH_SAMPLES", "4"))
LOSS_FROM = int(os.environ.get("PRIME_BENCH_LOSS_FROM", "32"))
DEVICE = os.environ.get("PRIME_BENCH_DEVICE", "cpu")
BF16 = os.environ.get("PRIME_BENCH_DTYPE", "float32") == "bfloat16"
MIXED = os.environ.get("PRIME_BENCH_TORCH_MIXED", "autocast")
if MIXED not in ("autocast", "master"):
    sys.exit(f"PRIME_BENCH_TORCH_MIXED: expected autocast or master, not {MIXED!r}")


def sync() -> None:
    if DEVICE.startswith("cuda"):
        torch.cuda.synchronize()


def gemm(shapes: str) -> list:
    dtype = torch.bfloat16 if BF16 else torch.float32
    out = []
    for shape in shapes.split(";"):
        m, k, n = (int(v) for v in shape.split(","))
        x, w = torch.randn(m, k, dtype=dtype), torch.randn(n, k, dtype=dtype)
        with torch.inference_mode():
            torch.nn.functional.linear(x, w)  # warm-up
            iters = max(3, int(4e9 / (2 * m * k * n)))
            t0 = time.perf_counter()
            for _ in range(iters):
                torch.nn.functional.linear(x, w)
            out.append(2 * m * k * n * iters / (time.perf_counter() - t0) / 1e9)
    return out


def main() -> None:
    folder, what = sys.argv[1], sys.argv[2]
    threads = int(sys.argv[-1])
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    if what == "gemm":
        print(json.dumps({"gflops": gemm(sys.argv[3]), "tokensPerSecond": 0, "seconds": 0, "peakRssMb": 0,
                          "versions": {"torch": torch.__version__}}))
        return
    # Decode in bf16 weights; train fp32 weights under bf16 autocast, or bf16 over fp32 masters.
    master = BF16 and what == "train" and MIXED == "master"
    dtype = torch.bfloat16 if BF16 and (what == "decode" or master) else torch.float32
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=dtype, attn_implementation="sdpa").to(DEVICE)
    vocab = model.config.vocab_size
    if what == "decode":
        batch = int(sys.argv[3])
        model.eval()
        gen = dict(do_sample=True, temperature=1.0, top_k=0, top_p=1.0)

        def run(b: int, new: int = NEW) -> None:
            ids = torch.randint(0, vocab, (b, PROMPT), device=DEVICE)
            with torch.inference_mode():
                model.generate(ids, attention_mask=torch.ones_like(ids), pad_token_id=0, max_new_tokens=new,
                               min_new_tokens=new, **gen)

        run(1, min(NEW, 16))  # warm-up, as the engine's (bench/compare.ts WARMUP_TOKENS)
        sync()
        t0 = time.perf_counter()
        run(batch)
        sync()
        seconds = time.perf_counter() - t0
        tokens = batch * NEW
    else:
        rows, length = int(sys.argv[3]), int(sys.argv[4])
        model.train()
        params = [p for p in model.parameters() if p.requires_grad]
        # "master": the optimizer steps fp32 copies; the model's bf16 weights are their casts.
        masters = [p.detach().float().requires_grad_(True) for p in params] if master else params
        opt = torch.optim.AdamW(masters, lr=1e-4, weight_decay=0.01, fused=DEVICE.startswith("cuda"))
        ids = torch.randint(0, vocab, (SAMPLES * rows, length // SAMPLES), device=DEVICE)
        labels = ids.clone()
        labels[:, :LOSS_FROM] = -100  # CE on tokens LOSS_FROM.. of each sample, as the engine's lossMask

        def step() -> None:
            opt.zero_grad(set_to_none=True)
            with torch.autocast(device_type=DEVICE.split(":")[0], dtype=torch.bfloat16, enabled=BF16 and not master):
                loss = model(input_ids=ids, labels=labels).loss
            loss.backward()
            if master:
                for m, p in zip(masters, params):
                    m.grad = p.grad.float()
                    p.grad = None
            torch.nn.utils.clip_grad_norm_(masters, 1.0)
            opt.step()
            if master:
                with torch.no_grad():
                    torch._foreach_copy_(params, masters)

        step()  # warm-up
        steps = int(os.environ.get("PRIME_BENCH_TRAIN_STEPS", "3"))
        sync()
        t0 = time.perf_counter()
        for _ in range(steps):
            step()
        sync()
        seconds = time.perf_counter() - t0
        tokens = steps * rows * length
        profile_dir = os.environ.get("PRIME_BENCH_PROFILE")
        if profile_dir:  # one more step under torch.profiler, as the engine side's --profile
            activities = [torch.profiler.ProfilerActivity.CPU]
            if DEVICE.startswith("cuda"):
                activities.append(torch.profiler.ProfilerActivity.CUDA)
            with torch.profiler.profile(activities=activities) as prof:
                step()
                sync()
            sort = "self_device_time_total" if DEVICE.startswith("cuda") else "self_cpu_time_total"
            with open(os.path.join(profile_dir, "torch-train.txt"), "w") as f:
                f.write(prof.key_averages().table(sort_by=sort, row_limit=40, max_name_column_width=100))
            prof.export_chrome_trace(os.path.join(profile_dir, "torch-train.json"))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"tokensPerSecond": tokens / seconds, "seconds": seconds, "peakRssMb": peak,
                      "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
                      "threads": torch.get_num_threads()}))


if __name__ == "__main__":
    main()
