"""`rlgen <command> [hydra overrides]`: each command is a Hydra app or a compose call on the same tree.

Before a Hydra app starts, its command line is read and every job's config composed (and for train, the
validation pass run), so a mistake gives one sentence and exit 2, not Hydra's raw text or a traceback."""

from __future__ import annotations

import importlib
import shlex
import sys
import traceback

from rlgen.commands.args import split_argv
from rlgen.config import register_configs
from rlgen.config.compose import CONF_DIR
from rlgen.errors import UserError
from rlgen.runtime.durability.run_lock import set_command_line

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

    import hydra

    from rlgen.commands.checks import print_problems

    register_configs()
    module, _, fn_name = task_fn_path.partition(":")

    @hydra.main(config_path=str(CONF_DIR), config_name="config", version_base="1.3")
    def app(cfg):  # noqa: ANN001 - Hydra passes a DictConfig
        fn = getattr(importlib.import_module(module), fn_name)
        try:
            return fn(cfg)
        except UserError as err:  # one sentence per problem, never a traceback
            print_problems(err.sentences())
            sys.exit(err.exit_code)
        except Exception as err:  # noqa: BLE001 - one line here, the traceback in the run directory
            sys.exit(_unexpected(name, err))

    from rlgen.commands.sweep import sweep_exit_code

    sweep_exit_code()  # a record left by an earlier call in this process
    sys.argv = [f"rlgen-{name}", *argv]
    app()
    return sweep_exit_code()


def _unexpected(name: str, err: BaseException) -> int:
    """An error no check foresaw: one line on the terminal, the traceback in <run dir>/error.log. Returns 1."""

    from rlgen.commands.checks import print_problems
    from rlgen.commands.train import run_dir

    path = run_dir() / "error.log"
    try:
        path.write_text("".join(traceback.format_exception(err)))
        where = f" (details: {path})"
    except OSError:
        where = ""
    print_problems([f"rlgen {name} failed: unexpected {type(err).__name__}: {err}{where}"])
    return 1


APPS = {
    "train": "rlgen.commands.train:train_app",
    "serve": "rlgen.commands.serve:serve_app",
    "bench": "rlgen.commands.bench:bench_app",
    "validate": "rlgen.commands.validate:validate_app",
}


def main(argv: list[str] | None = None) -> int:
    from rlgen.commands.checks import TRAIN_JOBS, check_command, print_problems
    from rlgen.commands.run_dirs import pin_run_dir

    argv = list(sys.argv[1:] if argv is None else argv)
    set_command_line(shlex.join(["rlgen", *argv]))
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
        overrides = args.overrides
        if cmd == "train":
            try:
                overrides = pin_run_dir(args, TRAIN_JOBS)
            except UserError as err:  # a live run, or another run's files, hold that directory: before Hydra writes
                return print_problems([str(err)])
        return _hydra_app(APPS[cmd], [*args.flags, *overrides], cmd)
    return print_problems([f"unknown command {cmd!r}; choose one of: plan, {', '.join(APPS)} (rlgen --help lists them)."])


if __name__ == "__main__":
    sys.exit(main())
