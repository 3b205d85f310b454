"""`rlgen bench`: the generation benchmark as a Hydra task; results go to Hydra's run directory."""

from __future__ import annotations

from typing import Any

from rlgen.bench.run import run_bench
from rlgen.config import to_run_config
from rlgen.runtime.cluster.dead_runs import stop_kept_for_own_cluster


def bench_app(dict_cfg: Any) -> dict:
    from rlgen.commands.train import run_dir

    stop_kept_for_own_cluster()  # engines a run kept warm hold GPU memory the bench measures with
    return run_bench(to_run_config(dict_cfg), run_dir())
