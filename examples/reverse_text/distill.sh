#!/usr/bin/env bash
# Online distillation on reverse-text: a small student (2 layers of width 128, half the teacher's
# depth), warmed up by SFT until its validation loss is 0.2 (mid-way through the task's phase
# transition, see README), learns from a trained teacher (the 4-layer model that run.sh trains) with
# pure distillation (distill.weight 0: no environment reward in the advantage) and the position
# baseline. Prints the student's held-out reward (avg@4 at temperature 1, 64 texts) at the start,
# half-way and at the end.
# CONTROL=1 also runs the same RL stage without the teacher (the environment's reward alone), from
# the same student weights, for comparison.
#   [CONTROL=1] bash examples/reverse_text/distill.sh [OUT] [TEACHER] [STEPS] [rl overrides...]
#   defaults: outputs/distill, outputs/reverse-text-rl/weights/step_250 (run.sh's RL result), 200
#   (the overrides go to the rl command)
set -euo pipefail
cd "$(dirname "$0")/../.."
bash scripts/setup.sh
CLI="node bin/prime-rl.js"
OUT=${1:-outputs/distill}
TEACHER=${2:-outputs/reverse-text-rl/weights/step_250}
STEPS=${3:-200}
STUDENT=$OUT/models/student
[ -f "$TEACHER/config.json" ] || { echo "no teacher at $TEACHER: run 'npm run reverse-text' first, or name one" >&2; exit 2; }

if [ ! -d "$OUT/student-sft/weights" ]; then
  $CLI model create --out "$STUDENT" --hidden-size 128 --intermediate-size 384 --num-layers 2 --num-heads 8 --num-kv-heads 8 --max-position-embeddings 512
  # A warm-up that stops mid-way: at validation loss 0.2 the student gets about half of the
  # held-out texts' characters right (0.56). From a student that has not started to learn the task
  # (150 steps, 0.30) neither distillation nor RL moved it much in 100 steps (README).
  $CLI sft @ configs/reverse_text/sft.toml --model.name "$STUDENT" --output-dir "$OUT" --run-name student-sft \
    --val.target-loss 0.2 --ckpt.interval 50
fi

SFT_STEP=$(ls "$OUT/student-sft/weights" | sed -n 's/^step_\([0-9]*\)$/\1/p' | sort -n | tail -1)

# The teacher on its own server (one core), stopped when this script ends.
PORT=${TEACHER_PORT:-8021}
$CLI inference --model.name "$TEACHER" --server.port "$PORT" --seq-len 256 --threads 1 &
TEACHER_PID=$!
trap 'kill $TEACHER_PID 2>/dev/null || true' EXIT
until curl -sf "http://127.0.0.1:$PORT/health" >/dev/null; do
  kill -0 $TEACHER_PID 2>/dev/null || { echo "the teacher server exited" >&2; exit 1; }
  sleep 1
done

$CLI rl @ configs/reverse_text/rl.toml --model.name "$OUT/student-sft/weights/step_$SFT_STEP" --output-dir "$OUT" \
  --run-name student-distill --max-steps "$STEPS" --eval.interval $((STEPS / 2)) \
  --distill.teacher "{\"base_url\": \"http://127.0.0.1:$PORT/v1\", \"model\": \"$TEACHER\"}" --distill.baseline position "${@:4}"

RUNS="student-distill"
if [ "${CONTROL:-0}" = 1 ]; then
  $CLI rl @ configs/reverse_text/rl.toml --model.name "$OUT/student-sft/weights/step_$SFT_STEP" --output-dir "$OUT" \
    --run-name student-rl --max-steps "$STEPS" --eval.interval $((STEPS / 2)) "${@:4}"
  RUNS="$RUNS student-rl"
fi

node -e '
const { readEvalResults } = require("./dist/lib/eval");
const f = (x) => (x === undefined ? "-" : x.toFixed(3));
for (const run of process.argv.slice(2)) {
  const evals = readEvalResults(process.argv[1] + "/" + run).sort((a, b) => (a.step ?? 0) - (b.step ?? 0));
  const how = run === "student-distill" ? "distillation" : "RL on the reward alone";
  const path = evals.map((r) => `${f(r.environments["reverse-text"].avg_at_k)} (step ${r.step ?? 0})`).join(" -> ");
  console.log(`student held-out reward (avg@4 at temperature 1, 64 texts), ${how}: ${path}`);
}
' "$OUT" $RUNS
