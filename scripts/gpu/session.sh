#!/usr/bin/env bash
# On the GPU machine, after scripts/gpu/run.sh has built the addon (it runs this as its trailing
# command, after the checks or with --no-checks): the benchmarks of issue #16 on the same card, ours
# next to transformers / PyTorch. Steps in order of what matters most, each with its own time
# limit, so a slow one costs only itself; each writes to $OUT as it goes:
#   compare.md     packed 4,096-token training and decode at 1 / 64 / 256 requests (CUDA graphs),
#                  Qwen3-0.6B shape, bf16, against PyTorch / transformers
#   profile.md     one training step of each side under its profiler: time by CUDA kernel
#                  (and each side's Kineto trace, xz-compressed: ours-train.json.xz, torch-train.json.xz)
#   decode.md      the engine's decode on the 0.6B shape, bf16, 128-token prompts, 256 new tokens, at 1 /
#                  64 / 256 / 1,024 sequences: tok/s, ms per step (device / host), the share of the
#                  card's bandwidth roofline, where a step's host time goes; then with the paged
#                  decode kernel, and with 8 decode steps per call
#   rl-workload.md an RL step's generation through the server on the 0.6B shape (16 prompts of 512
#                  tokens x 16 rollouts, 128 new tokens): wall time and prompt positions computed,
#                  prefix sharing off and on
#   inference.md   the server on the 0.6B model: throughput by concurrency, update_weights to first token
#   eager.md       decode at 1 and 64 with CUDA graphs off (what the graphs gain)
#   lm-head.md     our training step under other LM-head chunkings (only when named in
#                  PRIME_GPU_SESSION_ONLY): tokens per chunk, logits kept for the backward
#   fusion.md      our decode at 1 and 64 with the q/k/v and gate/up matmuls fused and one by one,
#                  alternating, one build (only when named in PRIME_GPU_SESSION_ONLY)
#   reverse-text.log  the reverse-text example on the card (only when named in PRIME_GPU_SESSION_ONLY)
#   rms-norm.md   RMSNorm forward + backward on the 0.6B step's shapes: the fused kernel, the fused
#                 kernel without its weight then a product, HF's eager norm (only when named)
#   kernels.md    each fused kernel (native/src/cuda/) against the libtorch path it replaces, forward
#                 + backward on the 0.6B step's shapes, and what it saves a step (only when named)
#   fused-step.md our training step (0.6B shape, 2 x 4,096, bf16) with the fused kernels and without,
#                 alternating, twice each (only when named)
#   baseline.md   our training step against PRIME_GPU_BASELINE_ADDON with half of each sample a
#                 prompt (--loss-from 512), where the LM head on loss tokens (0043865) shows (only
#                 when named, and with PRIME_GPU_BASELINE_ADDON)
#   rl-size.md    the RL loop at size on the card (configs/gpu/rl-0.6b.toml, 30 steps): the step time
#                 split, each role's tokens/s and peak memory (only when named)
#   rl.log         the `prime-rl rl` check's log (2 steps; PRIME_GPU_SESSION_RL=0 leaves it out,
#                  e.g. when the checks of the same call ran it)
#   bash scripts/gpu/run.sh --skip 'rl run' -- bash scripts/gpu/session.sh
# Issue #38's measurements, two commands (about 9 and 6 minutes):
#   PRIME_GPU_CHECKS_SECONDS=100 PRIME_GPU_SESSION_SECONDS=440 PRIME_GPU_SESSION_RL=0 \
#     PRIME_GPU_SESSION_ONLY=kernels,fused-step,baseline,rms-norm,inference \
#     PRIME_GPU_BASELINE_ADDON=/opt/prime-gpu/baseline/prime_native.node \
#     bash scripts/gpu/run.sh --only fused -- bash scripts/gpu/session.sh
#   PRIME_GPU_SESSION_ONLY=rl-size PRIME_GPU_SESSION_RL=0 PRIME_GPU_SESSION_SECONDS=400 \
#     bash scripts/gpu/run.sh --no-checks -- bash scripts/gpu/session.sh
# PRIME_GPU_SESSION_SECONDS: the time this script may take (default 400), shared out below;
# PRIME_GPU_DEADLINE (epoch seconds) ends it sooner (the device call's own limit);
# PRIME_GPU_SESSION_ONLY=inference,eager runs only the steps named (a later call finishing a run).
# PRIME_GPU_COMPARE_BATCHES: compare's decode batches (default 1,64,256; none = training alone).
# PRIME_GPU_TRACES=0: no Kineto traces in $OUT (a call brings back at most 8 files).
# PRIME_GPU_BASELINE_ADDON: another build of the addon (e.g. main's, built by scripts/gpu/bundle.sh
# from a checkout of it) that compare also runs our side on: before/after in the same call.
set -uo pipefail
cd "$(dirname "$0")/../.."
OUT=${OUT:-outputs/gpu}
PY=${PRIME_PYTHON:-python3}
mkdir -p "$OUT"
end=$((SECONDS + ${PRIME_GPU_SESSION_SECONDS:-400}))
if [ -n "${PRIME_GPU_DEADLINE:-}" ]; then
  by_deadline=$((SECONDS + PRIME_GPU_DEADLINE - $(date +%s)))
  [ "$by_deadline" -lt "$end" ] && end=$by_deadline
fi
echo "[gpu-session] $((end - SECONDS))s for the benchmarks"

# named NAME: PRIME_GPU_SESSION_ONLY names the step; selected NAME: it names it, or names none.
named() { [[ ",${PRIME_GPU_SESSION_ONLY:-}," == *",$1,"* ]]; }
selected() { [ -z "${PRIME_GPU_SESSION_ONLY:-}" ] || named "$1"; }

# step NAME SECONDS CMD...: runs CMD for at most SECONDS (less if the session's end comes first).
step() {
  local name=$1 secs=$2
  shift 2
  selected "$name" || return 0
  local left=$((end - SECONDS))
  [ "$left" -lt "$secs" ] && secs=$left
  if [ "$secs" -le 5 ]; then
    echo "[gpu-session] $name: skipped, the session's time is spent"
    return
  fi
  echo "[gpu-session] $name: at most ${secs}s"
  local t0=$SECONDS rc=0
  timeout --kill-after=10 "$secs" "$@" || rc=$?
  echo "[gpu-session] $name: exit $rc after $((SECONDS - t0))s"
}

nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
prof=/tmp/prime-gpu-profile
selected compare && rm -rf "$prof"
step compare 240 bash -c "node dist/bench/compare.js --models qwen3-0.6b --device cuda --dtype bfloat16 \
  --python '$PY' --prompt 128 --new 256 --batches ${PRIME_GPU_COMPARE_BATCHES:-1,64,256} --rows 2 --row-len 4096 --samples 4 \
  --profile $prof ${PRIME_GPU_BASELINE_ADDON:+--baseline-addon '$PRIME_GPU_BASELINE_ADDON'} | tee '$OUT/compare.md'"
# The two profiles of one training step side by side, and their traces.
if selected compare; then
  for side in ours torch; do
    [ -f "$prof/$side-train.txt" ] && { echo "## $side"; echo; cat "$prof/$side-train.txt"; echo; }
  done > "$OUT/profile.md"
  # The Kineto traces too, compressed, when each fits what a call brings back (16 MiB a file;
  # 8 files a call: PRIME_GPU_TRACES=0 leaves them out).
  for side in ours torch; do
    [ "${PRIME_GPU_TRACES:-1}" = 0 ] && break
    [ -f "$prof/$side-train.json" ] || continue
    xz -T0 -c "$prof/$side-train.json" > "$OUT/$side-train.json.xz" &&
      [ "$(stat -c %s "$OUT/$side-train.json.xz")" -le $((16 << 20)) ] || rm -f "$OUT/$side-train.json.xz"
  done
fi
step decode 300 bash -c "node dist/bench/decode.js --models qwen3-0.6b --device cuda --dtype bfloat16 \
  --prompt 128 --new 256 --concurrency 1,64,256,1024 | tee '$OUT/decode.md' &&
  node dist/bench/decode.js --models qwen3-0.6b --device cuda --dtype bfloat16 \
  --prompt 128 --new 256 --concurrency 1,64,256,1024 --paged-kernel | tee -a '$OUT/decode.md' &&
  node dist/bench/decode.js --models qwen3-0.6b --device cuda --dtype bfloat16 \
  --prompt 128 --new 256 --concurrency 64,256 --decode-steps 8 --paged-kernel | tee -a '$OUT/decode.md'"
step rl-workload 200 bash -c "node dist/bench/serving.js --workload rl --model qwen3-0.6b --device cuda \
  --dtype bfloat16 | tee '$OUT/rl-workload.md'"
step inference 150 bash -c "node dist/bench/inference.js --models qwen3-0.6b --device cuda --dtype bfloat16 \
  --concurrency 1,64 --requests 64 --max-tokens 128 | tee '$OUT/inference.md'"
step eager 80 bash -c "node dist/bench/compare.js --models qwen3-0.6b --device cuda --dtype bfloat16 --skip-torch \
  --no-train --prompt 128 --new 256 --batches 1 --eager-batches 1,64 | tee '$OUT/eager.md'"
# The LM head's chunking on the card (ours alone; after compare, whose model folder it reuses): the
# default (about 1 GiB of fp32 logits a chunk on a GPU: 1,766 tokens), the CPU's size (220 tokens),
# a whole row per chunk, and all of a row's logits kept for the backward.
if named lm-head; then
  for o in '{}' '{"logitsChunkTokens":220}' '{"logitsChunkTokens":4096}' \
    '{"logitsChunkTokens":2048,"logitsKeepBytes":8589934592}'; do
    echo "engine options $o"
    step lm-head 60 node dist/bench/compare.js --models qwen3-0.6b --device cuda --dtype bfloat16 --skip-torch \
      --batches none --rows 2 --row-len 4096 --samples 4 --engine-options "$o" 2>&1
  done | tee "$OUT/lm-head.md"
fi
# What fusing q/k/v and gate/up gains in decode (ours alone, the model folder compare made): the
# fused and one-by-one matmuls alternating, twice each.
if named fusion; then
  for o in '{}' '{"fusedProjections":false}' '{}' '{"fusedProjections":false}'; do
    echo "engine options $o"
    step fusion 60 node dist/bench/compare.js --models qwen3-0.6b --device cuda --dtype bfloat16 --skip-torch \
      --no-train --prompt 128 --new 256 --batches 1,64 --engine-options "$o" 2>&1
  done | tee "$OUT/fusion.md"
fi
# Which RMSNorm the training step should run on CUDA (torch alone, seconds).
if named rms-norm; then
  step rms-norm 60 bash -c "'$PY' bench/gpu/rms_norm.py | tee '$OUT/rms-norm.md'"
fi
# Our fused kernels, one by one against libtorch (seconds), then the whole training step with and
# without them (ours alone, the model folder compare makes or made), alternating.
if named kernels; then
  step kernels 90 node dist/bench/gpu/kernels.js --device cuda --out "$OUT/kernels.md"
fi
if named fused-step; then
  for o in '{}' '{"fusedKernels":true}' '{}' '{"fusedKernels":true}'; do
    echo "engine options $o"
    step fused-step 75 node dist/bench/compare.js --models qwen3-0.6b --device cuda --dtype bfloat16 --skip-torch \
      --batches none --rows 2 --row-len 4096 --samples 4 --engine-options "$o" 2>&1
  done | tee "$OUT/fused-step.md"
fi
# The previous addon against this one with half of each sample a prompt: the RoPE change (bdab464)
# shows at any --loss-from, the LM head on loss tokens (0043865) where samples have prompts.
if named baseline && [ -n "${PRIME_GPU_BASELINE_ADDON:-}" ]; then
  step baseline 100 node dist/bench/compare.js --models qwen3-0.6b --device cuda --dtype bfloat16 --skip-torch \
    --batches none --rows 2 --row-len 4096 --samples 4 --loss-from 512 --baseline-addon "$PRIME_GPU_BASELINE_ADDON" \
    2>&1 | tee "$OUT/baseline.md"
fi
# The RL loop at size: trainer and inference on the card, 30 steps (minutes).
if named rl-size; then
  step rl-size 390 node dist/bench/rl-size.js --device cuda --out "$OUT/rl-size.md"
fi
# The reverse-text example on the card (SFT, eval, RL; bf16): only when named, e.g. in a call of its
# own: PRIME_GPU_SESSION_ONLY=reverse-text PRIME_GPU_SESSION_SECONDS=560.
if named reverse-text; then
  step reverse-text 3600 bash -c "PRIME_SETUP=0 DEVICE=cuda DTYPE=bfloat16 bash examples/reverse_text/run.sh \
    --output-dir /tmp/prime-gpu-reverse-text > '$OUT/reverse-text.log' 2>&1"
fi
if [ "${PRIME_GPU_SESSION_RL:-1}" != 0 ]; then
  step rl 60 node dist/bench/gpu-checks.js --only 'rl run'
  log=$(ls -td /tmp/prime-gpu-checks-*/rl.log 2>/dev/null | head -1)
  [ -n "$log" ] && cp "$log" "$OUT/rl.log"
fi
