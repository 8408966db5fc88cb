"""The PyTorch side of bench/compare.ts: Hugging Face transformers + PyTorch eager on a model
folder, one workload per process (so ru_maxrss is that workload's peak). Prints one JSON line.

  python bench/compare_torch.py <model dir> decode <batch> <threads>
  python bench/compare_torch.py <model dir> train <rows> <row length> <threads>

decode: <batch> random prompts of PRIME_BENCH_PROMPT tokens (64), PRIME_BENCH_NEW sampled tokens
each (64; temperature 1, no top-k/top-p, no early stop), prefill included. train: the engine's
packed rows of PRIME_BENCH_SAMPLES (4) samples each, here a batch of samples * <rows> sequences of
<row length> / samples tokens (the same attention work: a packed row attends within each sample),
CE on tokens 32.. of each sample, backward, clip to norm 1, AdamW.

PRIME_BENCH_DEVICE (cpu) and PRIME_BENCH_DTYPE (float32) as the engine's: on CUDA, timings wait for
the device (synchronize), decode runs in bf16 weights and training in bf16 autocast over fp32
weights (mixed precision, as the engine's trainer).
"""
import json
import os
import resource
import sys
import time

import torch
from transformers import AutoModelForCausalLM

PROMPT = int(os.environ.get("PRIME_BENCH_PROMPT", "64"))
NEW = int(os.environ.get("PRIME_BENCH_NEW", "64"))
SAMPLES = int(os.environ.get("PRIME_BENCH_SAMPLES", "4"))
DEVICE = os.environ.get("PRIME_BENCH_DEVICE", "cpu")
BF16 = os.environ.get("PRIME_BENCH_DTYPE", "float32") == "bfloat16"


def sync() -> None:
    if DEVICE.startswith("cuda"):
        torch.cuda.synchronize()


def main() -> None:
    folder, what = sys.argv[1], sys.argv[2]
    threads = int(sys.argv[-1])
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    # Decode in bf16 weights; train fp32 master weights under bf16 autocast.
    dtype = torch.bfloat16 if BF16 and what == "decode" else torch.float32
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
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4, weight_decay=0.01)
        ids = torch.randint(0, vocab, (SAMPLES * rows, length // SAMPLES), device=DEVICE)
        labels = ids.clone()
        labels[:, :32] = -100  # CE on tokens 32.. of each sample, as the engine's lossMask

        def step() -> None:
            opt.zero_grad(set_to_none=True)
            with torch.autocast(device_type=DEVICE.split(":")[0], dtype=torch.bfloat16, enabled=BF16):
                loss = model(input_ids=ids, labels=labels).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()

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
                      "torch": torch.__version__, "threads": torch.get_num_threads()}))


if __name__ == "__main__":
    main()
