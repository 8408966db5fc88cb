"""prime-rl's launcher of a verifiers (0.4.0) environment: lib/envs/verifiers/ runs it.

  serve_env.py serve --config JSON   serve the env over ZeroMQ (verifiers.v1.serve.serve_env) on an
                                     OS-assigned loopback port; prints {"address": ...} once bound
  serve_env.py tasks --config JSON   print the taskset's tasks, one JSON task_data per line: the
                                     env server loads no dataset, the orchestrator ships each task

--config is the verifiers EnvConfig as a dict: {"taskset": {"id": <taskset id>, ...}, <agent>: {...}, ...},
the taskset id resolved as verifiers resolves it. An agent (of whatever name the env gives it) that
names no runtime runs as a local subprocess (verifiers defaults to remote sandboxes). A taskset
that is not installed exits 3, saying so.
A server exits when its stdin closes: it never outlives the orchestrator that started it.
"""

import argparse
import json
import os
import sys
import threading


# Exit status for a taskset that is not installed: the caller reports it as bad input.
NOT_INSTALLED = 3


def check_taskset_installed(taskset_id: str) -> None:
    """Exits NOT_INSTALLED, saying so on stderr, when verifiers cannot import the taskset."""
    from verifiers.v1.utils.loaders import import_taskset

    try:
        import_taskset(taskset_id)
    except ModuleNotFoundError as e:
        module = taskset_id.rsplit("/", 1)[-1].split("@", 1)[0].replace("-", "_").lower()
        # verifiers re-raises with its own message; the module that was missing is on the cause.
        missing = getattr(e.__cause__, "name", None) or e.name
        if missing not in (module, f"verifiers.v1.tasksets.{module}"):
            raise  # the taskset is there; something it imports is not
        print(
            f"taskset {taskset_id!r} is not installed in {sys.prefix}: verifiers imports it as "
            f"'verifiers.v1.tasksets.{module}' or '{module}', and neither is there. Install the package "
            f"that provides '{module}' into that environment ({sys.prefix}/bin/pip install <its package "
            f"or folder>; the verifiers repository's own tasksets are the folders under its environments/, e.g. environments/{module}), "
            f"or put the folder holding '{module}' on PYTHONPATH",
            file=sys.stderr,
        )
        sys.exit(NOT_INSTALLED)


def env_config(raw: str):
    """The EnvConfig of the env the taskset resolves to, with a local-subprocess runtime for each of
    its agents (whatever the env calls them: `agent`, `player`, ...) that names none."""
    from verifiers.v1.configs.agent import AgentConfig
    from verifiers.v1.utils.loaders import env_config_type, resolve_env_config

    data = json.loads(raw)
    taskset_id = (data.get("taskset") or {}).get("id", "")
    if taskset_id:
        check_taskset_installed(taskset_id)
    cls = env_config_type(taskset_id, data.get("id") or "")
    for name, field in cls.model_fields.items():
        if isinstance(field.default, AgentConfig):
            role = data.setdefault(name, {})
            if isinstance(role, dict):
                role.setdefault("runtime", {"type": "subprocess"})
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
