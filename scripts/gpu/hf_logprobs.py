#!/usr/bin/env python3
"""Per-token logprobs of token sequences under Hugging Face transformers, for bench/gpu/checks.ts.

    python3 scripts/gpu/hf_logprobs.py MODEL_DIR DEVICE DTYPE < {"sequences": [[ids...], ...]}

Prints {"logprobs": [[...], ...]}: for each sequence, log softmax(logits)[token t] from position
t - 1 (0 for the first token, as the native engine's RowScores), computed in fp32 from logits of
the model run in DTYPE (float32 or bfloat16) with SDPA attention on DEVICE (cpu, cuda, cuda:N).
"""

import json
import sys

import torch
from transformers import AutoModelForCausalLM


def main():
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    model_dir, device, dtype = sys.argv[1:]
    if dtype not in ('float32', 'bfloat16'):
        sys.exit(f'DTYPE must be float32 or bfloat16, not {dtype!r}')
    sequences = json.load(sys.stdin)['sequences']
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=getattr(torch, dtype), attn_implementation='sdpa')
    model.to(device).eval()
    out = []
    with torch.no_grad():
        for seq in sequences:
            ids = torch.tensor([seq], device=device)
            logp = torch.log_softmax(model(ids).logits[0].float(), dim=-1)
            picked = logp[:-1].gather(1, ids[0, 1:, None])[:, 0]
            out.append([0.0] + picked.cpu().tolist())
    json.dump({'logprobs': out}, sys.stdout)


if __name__ == '__main__':
    main()
