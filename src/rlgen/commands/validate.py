"""`rlgen validate`: an engine's logprobs against the hf reference, as a Hydra task. Exits 1 when the check
fails; a config the plan refuses is one sentence and exit 2 (the command line's error path)."""

from __future__ import annotations

import os
import sys
from typing import Any

from rlgen.runtime.cluster.dead_runs import stop_kept_for_own_cluster
from rlgen.validate.run import run_validate, split_config


def validate_app(dict_cfg: Any) -> float:
    """Returns the overall k3 KL (the objective of a sweep)."""
    from rich.console import Console

    from rlgen.commands.train import run_dir

    out_dir = run_dir()
    # hypothesis keeps a small cache; keep it in the run folder rather than the caller's working directory
    os.environ.setdefault("HYPOTHESIS_STORAGE_DIRECTORY", str(out_dir / ".hypothesis"))
    cfg, v = split_config(dict_cfg)
    stop_kept_for_own_cluster()  # engines a run kept warm hold GPU memory the engine under test needs
    report = run_validate(cfg, v, out_dir=out_dir, console=Console())
    if not report.passed:
        sys.exit(1)
    return float(report.row("all").k3_kl)
