"""`rlgen train`: the Hydra app that turns a composed config into a plan, actors and a GRPO run."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from rich.console import Console
from rich.markup import escape

from rlgen.config import RunConfig, to_run_config
from rlgen.plan import PlanError, build_plan


def run_dir() -> Path:
    """Hydra's output directory for this job (cwd when called outside a Hydra app)."""
    try:
        from hydra.core.hydra_config import HydraConfig

        return Path(HydraConfig.get().runtime.output_dir)
    except ValueError:
        return Path.cwd()


def run_training(cfg: RunConfig, out_dir: Path, console: Console | None = None) -> dict:
    from rlgen.balancer import context_from_plan
    from rlgen.metrics import MetricsSink
    from rlgen.orchestrator import Orchestrator
    from rlgen.report import balance_summary, print_summary, write_report

    console = console or Console()
    plan = build_plan(cfg)
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "plan.json").write_text(plan.to_json() + "\n")
    orch = Orchestrator(cfg, plan, out_dir)
    try:
        orch.setup()
        sink = MetricsSink(out_dir, cfg, cfg.steps, console)
        try:
            summary = orch.train(sink)
            summary["model_path"] = str(orch.save_final())
            summary["initial_model_path"] = str(orch.model_path)
        finally:
            sink.progress.stop()
        ctx = context_from_plan(plan)
        summary.update({f"balance_{k}": v for k, v in balance_summary(sink.records, ctx).items()})
        sink.close(summary)
        try:
            write_report(out_dir, sink.records, ctx)
        except Exception as err:  # noqa: BLE001 - a plotting problem must not fail a finished run
            console.print(f"[yellow]report not written:[/] {escape(str(err))}")
        print_summary(sink.records, ctx, console)
        return summary
    finally:
        orch.cleanup()


def _in_multirun() -> bool:
    try:
        from hydra.core.hydra_config import HydraConfig
        from hydra.types import RunMode

        return HydraConfig.get().mode == RunMode.MULTIRUN
    except (ImportError, ValueError):
        return False


def _job_failed(status: str, message: str, prefix: str, code: int) -> float:
    """Report a job that could not run or stopped. A single run exits with `code`; a job of a multirun writes
    its reason to status.json (the sweep summary shows it) and returns NaN, so the sweep goes on."""
    Console(stderr=True, soft_wrap=True).print(prefix + escape(message))
    if not _in_multirun():
        sys.exit(code)
    out = run_dir()
    out.mkdir(parents=True, exist_ok=True)
    (out / "status.json").write_text(json.dumps({"status": status, "reason": message}) + "\n")
    return float("nan")


def train_app(dict_cfg) -> float:
    """Hydra entry point. Returns the last-20% mean reward, so sweeps have an objective."""
    from rlgen.orchestrator import RunError

    console = Console()
    try:
        cfg = to_run_config(dict_cfg)
        summary = run_training(cfg, run_dir(), console)
    except PlanError as err:
        return _job_failed("rejected", "\n".join(err.problems), "[bold red]error:[/] ", 2)
    except RunError as err:
        return _job_failed("stopped", str(err), "[bold red]run stopped:[/] ", 1)
    console.print(json.dumps({k: summary[k] for k in ("reward_first_20pct", "reward_last_20pct")}), highlight=False)
    return float(summary["reward_last_20pct"])
