#!/usr/bin/env bash
# The reverse-text RL stage under several losses and seeds, from one SFT model: prints, per loss,
# the held-out reward (avg@4 at temperature 1, 64 texts) before and after RL for each seed, and the
# mean mismatch KL over the run's steps (prime-rl's CI keeps it below 0.01).
#   bash examples/reverse_text/compare_losses.sh [OUT] [LOSSES] [SEEDS]
#   defaults: outputs/losses "dppo grpo" "0 1 2"
set -euo pipefail
cd "$(dirname "$0")/../.."
bash scripts/setup.sh
CLI="node bin/prime-rl.js"
OUT=${1:-outputs/losses}
LOSSES=${2:-dppo grpo}
SEEDS=${3:-0 1 2}
MODEL=$OUT/models/reverse-text
SFT_WEIGHTS=$OUT/reverse-text-sft/weights

if [ ! -d "$SFT_WEIGHTS" ]; then
  $CLI model create --out "$MODEL" --hidden-size 128 --intermediate-size 384 --num-layers 4 --num-heads 8 --num-kv-heads 8 --max-position-embeddings 512
  $CLI sft @ configs/reverse_text/sft.toml --model.name "$MODEL" --output-dir "$OUT"
fi
SFT_STEP=$(ls "$SFT_WEIGHTS" | sed -n 's/^step_\([0-9]*\)$/\1/p' | sort -n | tail -1)

for loss in $LOSSES; do
  for seed in $SEEDS; do
    run=rl-$loss-seed$seed
    [ -f "$OUT/$run/metrics.jsonl" ] && grep -q '"step":249' "$OUT/$run/metrics.jsonl" && continue
    echo "[compare-losses] $run"
    $CLI rl @ configs/reverse_text/rl.toml --model.name "$SFT_WEIGHTS/step_$SFT_STEP" --output-dir "$OUT" \
      --run-name "$run" --seed "$seed" --trainer.loss.type "$loss"
  done
done

node -e '
const fs = require("fs");
const { readEvalResults } = require("./dist/lib/eval");
const { readStepMetrics } = require("./dist/lib/runfolder/metrics");
const [out, losses, seeds] = [process.argv[1], process.argv[2].split(" "), process.argv[3].split(" ")];
const f = (x) => (x === undefined ? "-" : x.toFixed(3));
for (const loss of losses) {
  const rows = seeds.map((seed) => {
    const dir = `${out}/rl-${loss}-seed${seed}`;
    const evals = readEvalResults(dir);
    const at = (step) => evals.find((r) => r.step === step)?.environments["reverse-text"].avg_at_k;
    const steps = readStepMetrics(`${dir}/metrics.jsonl`);
    const kl = steps.reduce((a, s) => a + s.mismatch_kl, 0) / steps.length;
    return { seed, before: at(null) ?? at(0), after: at(Math.max(...evals.map((r) => r.step ?? 0))), kl, klMax: Math.max(...steps.map((s) => s.mismatch_kl)) };
  });
  for (const r of rows) console.log(`${loss} seed ${r.seed}: held-out reward ${f(r.before)} -> ${f(r.after)} (${r.after >= r.before ? "+" : ""}${f(r.after - r.before)}), mismatch KL mean ${r.kl.toExponential(2)} max ${r.klMax.toExponential(2)}`);
  const gains = rows.map((r) => r.after - r.before);
  console.log(`${loss}: mean gain ${f(gains.reduce((a, b) => a + b, 0) / gains.length)}`);
}
' "$OUT" "$LOSSES" "$SEEDS"
