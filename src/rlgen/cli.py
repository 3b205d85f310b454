"""`rlgen <command> [hydra overrides]`: each command is a Hydra app or a compose call on the same tree."""

from __future__ import annotations

import json
import sys

USAGE = """usage: rlgen <command> [overrides ...]

commands:
  train     run GRPO with engine and learner actors (Hydra app: -m for sweeps, --cfg job, --help)
  plan      resolve and check the config, print where everything runs (--json PATH to save it)
  bench     generation benchmark on an RL-shaped workload (Hydra app)
  validate  compare an engine's logprobs against the hf reference (Hydra app)

examples:
  rlgen train                                   # CPU, tiny model, learns in minutes
  rlgen plan engine=vllm_tp2 hardware=8xh100
  rlgen train -m engine.num_engines=1,2
"""


def _fail(msg: str, code: int = 2) -> int:
    from rich.console import Console
    from rich.markup import escape

    Console(stderr=True, soft_wrap=True).print(f"[bold red]error:[/] {escape(msg)}", highlight=False)
    return code


def plan_main(argv: list[str]) -> int:
    from rlgen.compose import ConfigError, compose_run_config
    from rlgen.plan import PlanError, build_plan
    from rlgen.plan_view import print_plan_and_prediction

    json_path = None
    if "--json" in argv:
        i = argv.index("--json")
        if i + 1 >= len(argv):
            return _fail("--json needs a file path, e.g. rlgen plan --json plan.json")
        json_path = argv[i + 1]
        argv = argv[:i] + argv[i + 2 :]
    if "-m" in argv or "--multirun" in argv:
        return _fail("rlgen plan takes one config; sweep with rlgen train -m ... instead.")
    try:
        cfg = compose_run_config(argv)
        plan = build_plan(cfg)
    except ConfigError as err:
        return _fail(str(err))
    except PlanError as err:
        return _fail("\n".join(f"- {p}" for p in err.problems) if len(err.problems) > 1 else err.problems[0])
    print_plan_and_prediction(plan, cfg)
    if json_path:
        from pathlib import Path

        from rlgen.planner import predict

        Path(json_path).write_text(json.dumps({**plan.to_dict(), "prediction": predict(plan, cfg).to_dict()}, indent=2) + "\n")
        print(f"plan written to {json_path}")
    return 0


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
    "bench": "rlgen.bench:bench_app",
    "validate": "rlgen.validate:validate_app",
}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE)
        return 0 if argv else 2
    cmd, rest = argv[0], argv[1:]
    if cmd == "plan":
        return plan_main(rest)
    if cmd in APPS:
        return _hydra_app(APPS[cmd], rest, cmd)
    return _fail(f"unknown command {cmd!r}; choose one of: plan, {', '.join(APPS)}.\n{USAGE}")


if __name__ == "__main__":
    sys.exit(main())
