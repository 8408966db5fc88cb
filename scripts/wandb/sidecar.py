"""Logs a prime-rl run's step metrics to Weights & Biases with the official SDK.

Started by lib/run-ops/wandb.ts, which writes JSON lines to stdin:
  {"init": {"project", "name", "entity", "id", "dir", "config"}}   first, once
  {"step": N, "metrics": {"name": number, ...}}                     then one per step
EOF on stdin finishes the run. Replies on stdout, one JSON line each:
  {"ok": true, "start_step": N, "where": URL or folder}   after init (N: the first step not yet logged)
  {"ok": false, "error": "..."}                           when init fails (then it exits 1)
"""
import json
import sys


def reply(obj):
    sys.stdout.write(json.dumps(obj) + "\n")
    sys.stdout.flush()


def main():
    first = sys.stdin.readline()
    if not first:
        return 0
    spec = json.loads(first)["init"]
    try:
        import wandb

        run = wandb.init(
            project=spec["project"],
            name=spec.get("name"),
            entity=spec.get("entity"),
            id=spec["id"],
            dir=spec["dir"],
            config=spec.get("config"),
            resume="allow",
        )
    except Exception as e:  # no network, a bad key, a bad project: the caller says so once
        reply({"ok": False, "error": f"{type(e).__name__}: {e}"})
        return 1
    offline = run.settings.mode == "offline"
    reply({"ok": True, "start_step": run.step, "where": run.dir if offline else run.url})
    for line in sys.stdin:
        if not line.strip():
            continue
        msg = json.loads(line)
        run.log(msg["metrics"], step=msg["step"])
    run.finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
