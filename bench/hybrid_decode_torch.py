"""The transformers side of bench/hybrid-decode.ts: decode of B sequences that continue one prompt,
with Hugging Face transformers + PyTorch eager (for Qwen3.5, its torch fallback of the gated delta
rule: no flash-linear-attention or causal-conv1d kernels are installed). Prints one JSON line per
configuration, then one with the versions and the peak RSS.

  python bench/hybrid_decode_torch.py <model dir> <prompts, e.g. 128,4096> <batches, e.g. 1,64,256>
      <decode steps> <warm-up steps> <memory limit in bytes> <threads>

Per prompt length P: P random tokens prefilled once at batch 1 (timed: the prefill), the LM head on
the last position only (logits_to_keep=1). Per batch B: the prefill's cache copied and repeated to
B rows (the attention layers' K/V by the cache's batch_repeat_interleave, the Gated DeltaNet layers'
conv and recurrent states, which it leaves alone, by the same repeat here), the first token sampled
from the prefill's logits for each row, then warm-up + timed decode steps: a forward of one token
per row through the cache and sampling at temperature 1 over the whole vocabulary (softmax,
multinomial), as the engine's sampler. Wall and CPU time (all threads) of both. The cache's bytes are measured from its tensors: the fixed
state of a sequence (conv + recurrent) and its K/V per token. A batch whose cache would pass the
memory limit is skipped, and the line says so.
"""
import copy
import json
import resource
import sys
import time

import torch
import transformers
from transformers import AutoModelForCausalLM, DynamicCache

STATE_ATTRS = ("conv_states", "recurrent_states")  # dicts of tensors (transformers' LinearAttentionLayer)
KV_ATTRS = ("keys", "values")


def tensors(cache, attrs):
    """The cache's tensors of these attributes (a tensor, or a dict of them), layer by layer."""
    out = []
    for layer in cache.layers:
        for attr in attrs:
            v = getattr(layer, attr, None)
            for t in (v.values() if isinstance(v, dict) else [v]):
                if isinstance(t, torch.Tensor) and t.numel() > 0:
                    out.append(t)
    return out


def expanded(cache, b):
    """A copy of a batch-1 cache repeated to b rows: K/V and the linear-attention states alike."""
    c = copy.deepcopy(cache)
    for layer in c.layers:
        for attr in KV_ATTRS:
            t = getattr(layer, attr, None)
            if isinstance(t, torch.Tensor) and t.numel() > 0:
                setattr(layer, attr, t.repeat_interleave(b, dim=0))
        for attr in STATE_ATTRS:
            d = getattr(layer, attr, None)
            if isinstance(d, dict):
                for k, t in d.items():
                    if isinstance(t, torch.Tensor):
                        d[k] = t.repeat_interleave(b, dim=0)
    return c


def sample(logits):
    return torch.multinomial(torch.softmax(logits.float(), dim=-1), 1)


def main() -> None:
    folder = sys.argv[1]
    prompts = [int(v) for v in sys.argv[2].split(",")]
    batches = [int(v) for v in sys.argv[3].split(",")]
    steps, warmup, limit, threads = (int(v) for v in sys.argv[4:8])
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32, attn_implementation="sdpa")
    model.eval()
    vocab = model.config.vocab_size
    for P in prompts:
        with torch.inference_mode():
            ids = torch.randint(0, vocab, (1, P))
            cache = DynamicCache(config=model.config)
            t0, c0 = time.perf_counter(), time.process_time()
            out = model(input_ids=ids, cache=cache, use_cache=True, logits_to_keep=1)
            first = sample(out.logits[:, -1])
            prefill, prefill_cpu = time.perf_counter() - t0, time.process_time() - c0
        state = sum(t.nbytes for t in tensors(cache, STATE_ATTRS))
        kv_per_token = sum(t.nbytes for t in tensors(cache, KV_ATTRS)) // P
        del out
        for B in batches:
            row = {"prompt": P, "batch": B, "prefillSeconds": prefill, "prefillCpuSeconds": prefill_cpu, "stateBytes": state,
                   "kvBytesPerToken": kv_per_token}
            # The cache at its longest, and a step's logits and their softmax (fp32).
            need = B * (state + (P + warmup + steps + 1) * kv_per_token) + 3 * B * vocab * 4
            if need > limit:
                row["skipped"] = f"needs {need / 2**30:.1f} GiB of cache and logits, over the {limit / 2**30:.1f} GiB limit"
                print(json.dumps(row), flush=True)
                continue
            with torch.inference_mode():
                c = expanded(cache, B)
                tok = first.repeat(B, 1)
                for _ in range(warmup):
                    tok = sample(model(input_ids=tok, cache=c, use_cache=True).logits[:, -1])
                t0, c0 = time.perf_counter(), time.process_time()
                for _ in range(steps):
                    tok = sample(model(input_ids=tok, cache=c, use_cache=True).logits[:, -1])
                seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
                assert c.get_seq_length() == P + warmup + steps, c.get_seq_length()
            row.update(stepMs=1e3 * seconds / steps, cpuMsPerStep=1e3 * cpu / steps, tokensPerSecond=B * steps / seconds)
            del c
            print(json.dumps(row), flush=True)
    print(json.dumps({"versions": {"torch": torch.__version__, "transformers": transformers.__version__},
                      "threads": torch.get_num_threads(),
                      "peakRssMb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}), flush=True)


if __name__ == "__main__":
    main()
