"""One comparison table at the end of a Hydra multirun: sweep_summary.md and sweep_summary.json.

``SweepSummary`` is a Hydra callback. It remembers each job's output directory as the job ends; at the end of
the multirun it reads every job's ``metrics.jsonl`` (and ``summary.json``, ``plan.json``,
``.hydra/overrides.yaml`` where present), ranks the runs by end-to-end throughput (response tokens per
second of wall clock), and writes both files into the sweep directory. ``write_sweep_summary`` does the same
for any sweep directory after the fact.
"""

from __future__ import annotations

import json
import math
import os
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from hydra.experimental.callback import Callback

from rlgen.metrics.report import balance_summary, load_run
from rlgen.plan.layouts import layout_label as plan_layout_label
from rlgen.runtime.durability.status_file import read_status

# The exit codes of this process's sweep jobs that did not run to the end (rejected: 2, failed: 1): the sweep goes on
# past them, and its own exit code is the largest (sweep_exit_code).
FAILED_JOBS: list[int] = []


def note_failed_job(code: int) -> None:
    FAILED_JOBS.append(code)


def sweep_exit_code() -> int:
    """The exit code of the sweep this process ran (0 when every job ran), and the record cleared."""
    code = max(FAILED_JOBS, default=0)
    FAILED_JOBS.clear()
    return code


def _overrides(job_dir: Path) -> list[str]:
    path = job_dir / ".hydra" / "overrides.yaml"
    if not path.is_file():
        return []
    import yaml

    got = yaml.safe_load(path.read_text()) or []
    return [str(x) for x in got]


def collect_run(job_dir: str | Path) -> dict[str, Any]:
    """One job's row: its overrides, status, throughput and balance verdict. A job that resumed an earlier
    run (``resumed_into``) reports that run's directory."""

    job_dir = Path(job_dir)
    row: dict[str, Any] = {"job_dir": str(job_dir), "overrides": _overrides(job_dir)}
    if (job_dir / "resumed_into").is_file():
        job_dir = Path((job_dir / "resumed_into").read_text().strip())
        row["job_dir"] = str(job_dir)
    status = read_status(job_dir) or {}
    state = status.get("state")
    if state not in (None, "finished", "running", "starting") and status.get("reason"):
        row["reason"] = status["reason"]
    if not (job_dir / "metrics.jsonl").is_file():
        row["status"] = state or "no metrics"
        return row
    records, ctx = load_run(job_dir)
    finished = (job_dir / "summary.json").is_file()
    row["status"] = "ok" if finished else state or "stopped"
    row["num_engines"] = ctx.num_engines
    row["async_steps"] = ctx.async_steps
    row["layout"] = layout_label(ctx)
    row.update(balance_summary(records, ctx))
    if finished:
        summary = json.loads((job_dir / "summary.json").read_text())
        for key in ("reward_last_20pct", "reward_gain", "wall_s", "tokens_per_s", "gpu_busy_pct", "first_rollout_s"):
            if key in summary:
                row["summary_" + key] = summary[key]
    return row


def layout_label(ctx: Any) -> str:
    """Where a run's engines sat (the plan picks it where the config names none): hybrid or a split of the GPUs,
    at its TP size; "CPU" without GPUs, "-" where the run's plan did not say."""
    if ctx.device == "cpu":
        return "CPU"
    if ctx.device != "cuda":
        return "-"
    return plan_layout_label(ctx.colocated, ctx.tensor_parallel_size, ctx.engine_gpus, ctx.learner_gpus)


def _job_dirs(sweep_dir: Path) -> list[Path]:
    """Job directories under a sweep: those holding metrics.jsonl or Hydra's .hydra folder."""
    found = {p.parent for p in sweep_dir.rglob("metrics.jsonl")}
    found |= {p.parent for p in sweep_dir.rglob(".hydra") if p.parent != sweep_dir}
    return sorted(found)


def rank(rows: Iterable[dict[str, Any]]) -> list[dict[str, Any]]:
    """Runs with throughput first, fastest first; then the rest in their given order."""
    rows = list(rows)
    ok = [r for r in rows if r.get("tokens_per_s_end_to_end", 0) > 0]
    rest = [r for r in rows if r not in ok]
    ok.sort(key=lambda r: -r["tokens_per_s_end_to_end"])
    for i, r in enumerate(ok, 1):
        r["rank"] = i
    return ok + rest


def _cell(x: Any, fmt: str = "") -> str:
    if x is None or (isinstance(x, float) and not math.isfinite(x)):
        return "-"
    if isinstance(x, float):
        return format(x, fmt or ".3g")
    return str(x).replace("|", "\\|")


def common_overrides(points: list[list[str]]) -> list[str]:
    """The overrides every point of a sweep shares (none for a single point)."""
    return [o for o in points[0] if all(o in p for p in points[1:])] if len(points) > 1 else []


def point_label(overrides: list[str], common: list[str]) -> str:
    """A sweep point by the overrides that set it apart from the others (common_overrides)."""
    own = [o for o in overrides if o not in common]
    return " ".join(own) or "(defaults)"


def _common_overrides(rows: list[dict[str, Any]]) -> list[str]:
    return common_overrides([r.get("overrides") or [] for r in rows])


def _label(row: dict[str, Any], common: list[str]) -> str:
    return point_label(row.get("overrides") or [], common)


def to_markdown(rows: list[dict[str, Any]], sweep_dir: Path) -> str:
    common = _common_overrides(rows)
    lines = [
        f"# Sweep summary: {sweep_dir}",
        "",
        f"Every run: `{' '.join(common)}`." if common else "",
        "Ranked by end-to-end throughput (response tokens per second of step wall clock, first step left out).",
        "Verdicts are means over the steps past the first: generate/train is the time to generate a batch over the "
        "time to train on it, and steps spread is the longest of those steps over the shortest (over 1.5x, a run's "
        "steps alternate, and its advice says between what).",
        "",
        "| rank | overrides | layout | tok/s end to end | generation tok/s | learner needs tok/s | step s | steps spread "
        "| learner wait | engines idle | generate/train | verdict | GPU busy | first rollout s | reward (last 20%) "
        "| status |",
        "|---:|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---:|---:|---:|---|",
    ]
    for r in rows:
        lines.append("| " + " | ".join([
            _cell(r.get("rank")),
            _cell(_label(r, common)),
            _cell(r.get("layout")),
            _cell(r.get("tokens_per_s_end_to_end"), ",.0f"),
            _cell(r.get("gen_tokens_per_s"), ",.0f"),
            _cell(r.get("required_tokens_per_s"), ",.0f"),
            _cell(r.get("step_s")),
            _cell(r.get("spread"), ".1f") + ("x" if isinstance(r.get("spread"), float) else ""),
            _cell(r.get("learner_wait_frac"), ".0%"),
            _cell(r.get("engine_idle_frac"), ".0%"),
            _cell(r.get("ratio"), ".2f"),
            _cell(str(r.get("kind", "-")).replace("_", "-")),
            _cell(r.get("summary_gpu_busy_pct"), ".1f"),
            _cell(r.get("summary_first_rollout_s"), ".1f"),
            _cell(r.get("summary_reward_last_20pct"), ".3f"),
            _cell(r.get("status")),
        ]) + " |")
    lines += ["", "## Advice", ""]
    for r in rows:
        if r.get("advice"):
            lines.append(f"- `{_label(r, common)}`: {r['advice']}")
    failed = [r for r in rows if r.get("reason")]
    if failed:
        lines += ["", "## Runs that did not finish", ""]
        lines += [f"- `{_label(r, common)}` ({r['status']}): {r['reason']}" for r in failed]
    return "\n".join(lines) + "\n"


def write_sweep_summary(sweep_dir: str | Path, job_dirs: Iterable[str | Path] | None = None) -> tuple[Path, Path]:
    """Write sweep_summary.md and sweep_summary.json into sweep_dir; returns their paths."""
    sweep_dir = Path(sweep_dir)
    dirs = sorted({Path(d) for d in job_dirs}) if job_dirs else _job_dirs(sweep_dir)
    rows = rank(collect_run(d) for d in dirs)
    md = sweep_dir / "sweep_summary.md"
    js = sweep_dir / "sweep_summary.json"
    md.write_text(to_markdown(rows, sweep_dir))
    clean = [{k: (str(v) if isinstance(v, float) and not math.isfinite(v) else v) for k, v in r.items()} for r in rows]
    js.write_text(json.dumps({"sweep_dir": str(sweep_dir), "runs": clean}, indent=2) + "\n")
    return md, js


def print_sweep(rows: list[dict[str, Any]], console=None) -> None:
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    console = console or Console(soft_wrap=True)
    t = Table(title="sweep, fastest first", title_justify="left")
    for col in ("rank", "overrides", "layout", "tok/s", "verdict", "learner wait", "engines idle"):
        t.add_column(col, overflow="fold")
    common = _common_overrides(rows)
    for r in rows:
        t.add_row(_cell(r.get("rank")), escape(_label(r, common)), _cell(r.get("layout")),
                  _cell(r.get("tokens_per_s_end_to_end"), ",.0f"), _cell(r.get("kind")),
                  _cell(r.get("learner_wait_frac"), ".0%"), _cell(r.get("engine_idle_frac"), ".0%"))
    console.print(t)


class SweepSummary(Callback):
    """Hydra callback: ``hydra.callbacks.sweep_summary._target_: rlgen.commands.sweep.SweepSummary``."""

    def __init__(self, print_table: bool = True) -> None:
        self.print_table = print_table
        self.job_dirs: list[Path] = []

    def on_job_end(self, config: Any, job_return: Any, **kwargs: Any) -> None:
        hydra_cfg = getattr(job_return, "hydra_cfg", None)
        try:
            self.job_dirs.append(Path(hydra_cfg.hydra.runtime.output_dir))
        except AttributeError:
            pass

    def on_multirun_end(self, config: Any, **kwargs: Any) -> None:
        sweep_dir = Path(str(config.hydra.sweep.dir)).resolve()
        dirs = [d.resolve() for d in self.job_dirs if d.is_dir()]
        if dirs and not all(sweep_dir in d.parents for d in dirs):
            sweep_dir = _common_parent(dirs)
        if not sweep_dir.is_dir():
            return
        from rich.console import Console
        from rich.markup import escape

        md, js = write_sweep_summary(sweep_dir, dirs or None)
        rows = json.loads(js.read_text())["runs"]
        if self.print_table:
            console = Console(soft_wrap=True)
            print_sweep(rows, console)
            console.print(f"sweep summary: {md}", highlight=False)
        if line := unfinished_line(rows):
            Console(stderr=True, soft_wrap=True).print(f"[bold red]error:[/] {escape(line)}", highlight=False)


def unfinished_line(rows: list[dict[str, Any]]) -> str | None:
    """One sentence naming the sweep points that were rejected, failed or stopped, and why; None when all
    finished."""
    common = _common_overrides(rows)
    bad = [r for r in rows if r.get("status") in ("rejected", "failed", "stopped")]
    if not bad:
        return None
    said = "; ".join(f"{_label(r, common)} ({r['status']}: {' '.join(str(r.get('reason', '')).split()).rstrip('.')})"
                     for r in bad)
    return f"{len(bad)} of {len(rows)} sweep points did not run to the end: {said}."


def _common_parent(dirs: list[Path]) -> Path:
    return Path(os.path.commonpath([str(d) for d in dirs])) if len(dirs) > 1 else dirs[0].parent
