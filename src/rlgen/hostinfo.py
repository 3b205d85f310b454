"""Where an actor runs, for health(): its process id and, inside Ray, its node id."""

from __future__ import annotations

import os
import sys


def process_info() -> dict[str, object]:
    info: dict[str, object] = {"pid": os.getpid()}
    if "ray" in sys.modules:
        try:
            import ray

            if ray.is_initialized():
                info["node"] = ray.get_runtime_context().get_node_id()
        except Exception:  # noqa: BLE001 - only informative
            pass
    return info
