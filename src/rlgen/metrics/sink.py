"""Per-step metrics: a JSONL file, a rich live progress line, optional wandb, and an end-of-run summary."""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import time
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

from rlgen.config import RunConfig, WandbMode
from rlgen.durable import append_line, replace_text
from rlgen.metrics.summary_table import print_run_summary

log = logging.getLogger("rlgen.console")


def _jsonable(v: Any) -> Any:
    if isinstance(v, float) and not math.isfinite(v):
        return str(v)
    if isinstance(v, dict):
        return {k: _jsonable(x) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    return v


def read_jsonl(path: str | Path) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def keep_lines(path: Path, n: int) -> list[dict]:
    """Cut a JSONL file to its first n lines (a resumed run redoes the steps after its checkpoint); returns them.
    The file is replaced whole, so a failure leaves it as it was."""
    lines = path.read_text().splitlines(keepends=True) if path.is_file() else []
    if len(lines) < n:
        raise ValueError(f"{path} has {len(lines)} lines, but the checkpoint says {n} steps were logged.")
    replace_text(path, "".join(lines[:n]))
    return [json.loads(line) for line in lines[:n]]


class MetricsSink:
    def __init__(self, out_dir: Path, cfg: RunConfig, total_steps: int, console: Console | None = None, *,
                 resume_lines: int | None = None, wall_before: float = 0.0):
        """resume_lines: continue a run whose metrics.jsonl holds (at least) that many steps; later lines are
        dropped, new ones appended. wall_before: wall time the run spent before this resume."""
        self.out_dir = Path(out_dir)
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.path = self.out_dir / "metrics.jsonl"
        self.records: list[dict] = [] if resume_lines is None else keep_lines(self.path, resume_lines)
        # O_APPEND, unbuffered, one os.write per line: a line lands whole or (cut back on failure) not at all
        flags = os.O_WRONLY | os.O_CREAT | os.O_APPEND | (os.O_TRUNC if resume_lines is None else 0)
        self._file = open(os.open(self.path, flags, 0o666), "ab", buffering=0)
        self.console = console or Console()
        self.t0 = time.time() - wall_before
        self.progress = Progress(
            TextColumn("[bold]step"),
            MofNCompleteColumn(),
            BarColumn(bar_width=20),
            TextColumn("reward {task.fields[reward]}  tok/s {task.fields[toks]}  v{task.fields[version]}"),
            TimeRemainingColumn(),
            console=self.console,
            disable=not cfg.progress,
            transient=False,
        )
        done = len(self.records)
        self.task_id = self.progress.add_task("train", total=total_steps, completed=done, reward="-", toks="-",
                                              version=self.records[-1]["version"] if done else 0)
        self.progress.start()
        self.wandb = None
        if cfg.wandb.mode != WandbMode.disabled:
            try:
                import wandb
            except ImportError as err:
                raise RuntimeError("wandb.mode is set but wandb is not installed; pip install 'rlgen[wandb]'.") from err
            from omegaconf import OmegaConf

            self.wandb = wandb.init(
                project=cfg.wandb.project,
                entity=cfg.wandb.entity,
                mode=cfg.wandb.mode.value,
                dir=str(self.out_dir),
                config=OmegaConf.to_container(OmegaConf.structured(cfg), resolve=True),
                # one wandb run per run directory, so a resumed run continues its curves
                id=hashlib.sha1(str(self.out_dir.resolve()).encode()).hexdigest()[:16],
                resume="allow",
            )

    def log(self, record: dict) -> None:
        """Append the step's line to metrics.jsonl (whole, or not at all with an OSError naming the file), then
        show it. A record whose line could not be written is not kept in ``records`` either."""
        append_line(self._file.fileno(), self.path, json.dumps(_jsonable(record)) + "\n")
        self.records.append(record)
        self.progress.update(
            self.task_id,
            advance=1,
            reward=f"{record['reward_mean']:.3f}",
            toks=f"{record['tokens_per_s']:.0f}",
            version=record["version"],
        )
        line = (f"step {record['step']}: reward {record['reward_mean']:.3f} loss {record['loss']:.4f} "
                f"tok/s {record['tokens_per_s']:.0f} staleness {record['staleness']}")
        if not self.console.is_terminal and (record["step"] % 10 == 0):
            self.console.print(line, highlight=False)  # a MirroredConsole also logs it
        else:
            log.info("%s", line)
        if self.wandb is not None:
            flat = {k: v for k, v in record.items() if isinstance(v, (int, float))}
            self.wandb.log(flat, step=record["step"])

    def summary(self) -> dict:
        recs = self.records
        if not recs:
            return {"steps": 0}
        k = max(1, len(recs) // 5)
        first = sum(r["reward_mean"] for r in recs[:k]) / k
        last = sum(r["reward_mean"] for r in recs[-k:]) / k

        def mean(key: str) -> float:
            return sum(r[key] for r in recs) / len(recs)

        return {
            "steps": len(recs),
            "wall_s": time.time() - self.t0,
            "reward_first_20pct": first,
            "reward_last_20pct": last,
            "reward_gain": last - first,
            "tokens_per_s": mean("tokens_per_s"),
            "step_s": mean("step_s"),
            "generate_s": mean("generate_s"),
            "train_s": mean("train_s"),
            "wait_s": mean("wait_s"),
            "sync_s": mean("sync_s"),
            "sync_pause_s": mean("sync_pause_s") if all("sync_pause_s" in r for r in recs) else None,
            "max_staleness": max(r["staleness"] for r in recs),
            "skipped_steps": sum(1 for r in recs if r.get("skipped")),
            "engine_restarts": recs[-1].get("engine_restarts", 0),
            # the last held-out evaluation (eval.every > 0 evaluates at the last step too)
            **{k: v for k, v in recs[-1].items() if k.startswith("eval/")},
            "final_version": recs[-1]["version"],
        }

    def close(self, summary: dict) -> None:
        self.progress.stop()
        self._file.close()
        replace_text(self.out_dir / "summary.json", json.dumps(_jsonable(summary), indent=2) + "\n")
        print_run_summary(summary, self.console, self.out_dir)
        if self.wandb is not None:
            self.wandb.summary.update({k: v for k, v in summary.items() if isinstance(v, (int, float))})
            self.wandb.finish()
