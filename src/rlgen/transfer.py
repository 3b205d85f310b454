"""Weight-transfer primitives shared by the learners' sending half and the runtime's transports: errors,
bucketing, and waits that always end (a thread with a timeout, Ray refs or futures with a deadline)."""

from __future__ import annotations

import concurrent.futures
import json
import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

DEFAULT_BUCKET_BYTES = 1 << 30  # packed-buffer size; raised to the largest tensor when that is larger
NUM_BUFFERS = 2  # NCCL double buffering: pack chunk k+1 while chunk k is on the wire
SLACK_S = 30.0  # the driver waits this much longer than the actors it waits on


class SyncError(RuntimeError):
    """A weight update failed; the message says why and what to do."""


class SyncTimeoutError(SyncError):
    pass


# -- pure helpers ------------------------------------------------------------------------------------------
def plan_buckets(sizes: Sequence[int], bucket_bytes: int) -> list[range]:
    """Split tensors (by byte size, in order) into consecutive ranges of at most bucket_bytes each; a tensor
    larger than bucket_bytes forms a bucket of its own. Every index appears exactly once, in order."""
    if bucket_bytes < 1:
        raise ValueError(f"bucket_bytes={bucket_bytes} must be positive")
    buckets: list[range] = []
    start, used = 0, 0
    for i, size in enumerate(sizes):
        if i > start and used + size > bucket_bytes:
            buckets.append(range(start, i))
            start, used = i, 0
        used += size
    if start < len(sizes):
        buckets.append(range(start, len(sizes)))
    return buckets


def run_with_timeout(fn: Callable[[], Any], timeout_s: float, what: str) -> Any:
    """fn() on a daemon thread, waited for at most timeout_s. On timeout the thread is left behind (a
    blocked NCCL call cannot be interrupted) and SyncTimeoutError says so."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = fn()
        except BaseException as err:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = err

    thread = threading.Thread(target=target, name=f"rlgen-sync-{what[:20]}", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise SyncTimeoutError(
            f"{what} did not finish within {timeout_s:.0f} s. The transfer cannot be cancelled, so this "
            "process is unusable for weight sync; restart the run (raise timeout_s if the model is large)."
        )
    if "error" in box:
        raise box["error"]
    return box.get("value")


def get_all(
    refs: Sequence[Any], timeout_s: float, what: str, names: Sequence[str] | None = None, *, fetch: bool = True
) -> list[Any]:
    """Results of Ray object refs (or concurrent futures), in order, waiting at most timeout_s in all
    (fetch=False: only wait, return []). The first call to fail raises at once, so one side of a transfer
    failing does not leave the driver waiting on the other; SyncTimeoutError names the calls still out."""
    refs = list(refs)
    names = list(names) if names is not None else [f"call {i}" for i in range(len(refs))]
    if not refs:
        return []
    if all(isinstance(r, concurrent.futures.Future) for r in refs):
        done, _ = concurrent.futures.wait(refs, timeout=timeout_s, return_when=concurrent.futures.FIRST_EXCEPTION)
        for r in done:
            if r.exception() is not None:
                raise r.exception()
        late = [n for n, r in zip(names, refs) if r not in done]
        if late:
            raise SyncTimeoutError(f"{what}: no answer within {timeout_s:.0f} s from {', '.join(late)}.")
        return [r.result() for r in refs] if fetch else []
    import ray

    deadline, remaining = time.time() + timeout_s, list(refs)
    while remaining:
        ready, remaining = ray.wait(remaining, num_returns=1, timeout=max(0.0, deadline - time.time()))
        if not ready:
            out = {r.hex() for r in remaining}
            late = [n for n, r in zip(names, refs) if r.hex() in out]
            raise SyncTimeoutError(f"{what}: no answer within {timeout_s:.0f} s from {', '.join(late)}.")
        if fetch:
            ray.get(ready)  # raises now if that call failed
    return ray.get(refs) if fetch else []


def check_versions(results: Sequence[dict[str, Any]], version: int, what: str) -> None:
    wrong = [(r.get("actor", "?"), r.get("version")) for r in results if r.get("version") != version]
    if wrong:
        raise SyncError(f"{what}: expected policy version {version} everywhere, got {wrong}.")


def write_adapter(folder: str, tensors: dict[str, Any], config: dict[str, Any]) -> None:
    """A PEFT adapter folder (adapter_config.json, adapter_model.safetensors) from a LoRA adapter's tensors and
    config: what a learner's checkpoint holds and what a vllm engine loads."""

    from safetensors.torch import save_file

    os.makedirs(folder, exist_ok=True)
    save_file(tensors, os.path.join(folder, "adapter_model.safetensors"))
    with open(os.path.join(folder, "adapter_config.json"), "w") as f:
        json.dump(config, f, indent=2)


def read_adapter_config(folder: str) -> tuple[dict[str, Any] | None, str | None]:
    """(adapter_config.json of the PEFT adapter folder, None), or (None, why it cannot be read: the end of a
    sentence that starts with the folder)."""

    path = os.path.join(os.path.expanduser(folder), "adapter_config.json")
    if not os.path.isfile(path):
        return None, "is not a PEFT adapter folder (no adapter_config.json there)"
    try:
        with open(path) as f:
            value = json.load(f)
    except (OSError, ValueError) as err:
        return None, f"has an adapter_config.json that cannot be read as JSON ({err})"
    return (value if isinstance(value, dict) else {}), None
