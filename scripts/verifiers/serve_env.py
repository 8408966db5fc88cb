"""prime-rl's launcher of a verifiers (0.4.0) environment: lib/envs/verifiers/ runs it.

  serve_env.py serve --config JSON   serve the env over ZeroMQ (verifiers.v1.serve.serve_env) on an
                                     OS-assigned loopback port; prints {"address": ...} once bound
  serve_env.py tasks --config JSON   print the taskset's tasks, one JSON task_data per line: the
                                     env server loads no dataset, the orchestrator ships each task

--config is the verifiers EnvConfig as a dict: {"taskset": {"id": <module>, ...}, ...}. Without an
`agent.runtime` the agent runs as a local subprocess (verifiers defaults to remote sandboxes).
A server exits when its stdin closes: it never outlives the orchestrator that started it.
"""

import argparse
import json
import os
import sys
import threading


def env_config(raw: str):
    from verifiers.v1.utils.loaders import resolve_env_config

    data = json.loads(raw)
    agent = data.setdefault("agent", {})
    agent.setdefault("runtime", {"type": "subprocess"})
    return resolve_env_config(data)


def exit_with_parent() -> None:
    def watch() -> None:
        sys.stdin.buffer.read()
        os._exit(0)

    threading.Thread(target=watch, daemon=True).start()


class PrintAddress:
    """serve_env reports the bound address with .put()."""

    def put(self, address: str) -> None:
        print(json.dumps({"address": address}), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("command", choices=["serve", "tasks"])
    parser.add_argument("--config", required=True)
    parser.add_argument("--max-concurrent", type=int, default=None)
    args = parser.parse_args()
    config = env_config(args.config)
    if args.command == "tasks":
        from verifiers.v1.utils.loaders import load_taskset

        for task in load_taskset(config.taskset):
            print(json.dumps(task.data.model_dump(mode="json", serialize_as_any=True)), flush=True)
        return
    from verifiers.v1.serve import serve_env

    exit_with_parent()
    serve_env(
        max_workers=1,
        address="tcp://127.0.0.1:0",
        address_queue=PrintAddress(),
        config=config,
        max_concurrent=args.max_concurrent,
    )


if __name__ == "__main__":
    main()
