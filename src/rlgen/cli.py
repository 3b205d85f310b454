"""`rlgen <command> [hydra overrides]`: each command is a Hydra app or a compose call on the same tree.

Before a Hydra app starts, its command line is read and every job's config composed (and for train, the
validation pass run), so a mistake gives one sentence and exit 2, not Hydra's raw text or a traceback."""

from __future__ import annotations

import sys

USAGE = """usage: rlgen <command> [overrides ...]

commands:
  train     run GRPO with engine and learner actors (Hydra app: -m for sweeps, --cfg job, --help)
  plan      resolve and check the config, print where everything runs (--json PATH to save it)
  serve     engines behind an HTTP API: generation, weight updates, sleep/wake (Hydra app)
  bench     generation benchmark on an RL-shaped workload (Hydra app)
  validate  compare an engine's logprobs against the hf reference (Hydra app)

examples:
  rlgen train                                   # CPU, tiny model, learns in minutes
  rlgen plan engine=vllm_tp2 hardware=8xh100
  rlgen train -m engine.num_engines=1,2
  rlgen train resume=auto                       # continue the newest stopped run with these settings
  rlgen serve serve.port=8000                   # then: rlgen train engine=remote engine.url=http://127.0.0.1:8000
"""


def _hydra_app(task_fn_path: str, argv: list[str], name: str) -> int:
    """Run `module:function(cfg)` as a Hydra app so -m, --cfg and --help behave as Hydra documents."""
    import importlib

    import hydra

    from rlgen.compose import CONF_DIR
    from rlgen.config import register_configs

    register_configs()
    module, _, fn_name = task_fn_path.partition(":")

    @hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")
    def app(cfg):  # noqa: ANN001 - Hydra passes a DictConfig
        fn = getattr(importlib.import_module(module), fn_name)
        return fn(cfg)

    sys.argv = [f"rlgen-{name}", *argv]
    app()
    return 0


APPS = {
    "train": "rlgen.commands.train:train_app",
    "serve": "rlgen.serve.command:serve_app",
    "bench": "rlgen.bench:bench_app",
    "validate": "rlgen.validate:validate_app",
}


def main(argv: list[str] | None = None) -> int:
    from rlgen.commands.args import split_argv
    from rlgen.commands.checks import check_command, print_problems

    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd == "plan":
        from rlgen.commands.plan import main as plan_main

        return plan_main(rest)
    if cmd in APPS:
        code = check_command(cmd, rest)
        if code is not None:
            return code
        # Hydra's argument parser wants its flags before the overrides; a user may type them anywhere.
        args = split_argv(cmd, rest)
        return _hydra_app(APPS[cmd], [*args.flags, *args.overrides], cmd)
    return print_problems([f"unknown command {cmd!r}; choose one of: plan, {', '.join(APPS)} (rlgen --help lists them)."])


if __name__ == "__main__":
    sys.exit(main())
