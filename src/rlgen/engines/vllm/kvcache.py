"""The KV-cache size a vLLM engine measured, kept for its next start, and a per-GPU lock around the measuring.

vLLM sizes the KV cache by profiling the GPU's free memory, which another process starting on that GPU skews.
So an engine with no stored size measures it holding its GPU's lock alone and stores the bytes under
``vllm-kv/`` in the cache_dir, keyed by everything the size depends on; a later start passes it to vLLM as
``kv_cache_memory_bytes`` and shares the lock, so such starts run side by side. A start that fails drops its
stored size. docs/startup.md has the key, the lock's early hand-over and what is never stored.
No vllm or torch import here at module level.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from rlgen.engines.vllm.common import EngineError
from rlgen.gpustart import acquire, gpu_indices, lock_paths, visible_devices

NOT_KEYED = ("model", "seed")  # engine arguments the KV size does not depend on
DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4}
GIB = 2**30
# vLLM 0.26 logs the KV size it measured once profiling ends, in GiB with two decimals
MEASURED_LINE = re.compile(r"Available KV cache memory: ([\d.]+) GiB")
LOG_POLL_S = 0.5


def cache_dir() -> Path:
    """``vllm-kv`` under the run's cache_dir, which engine actors get as RLGEN_CACHE_DIR (~/.cache/rlgen)."""
    return Path(os.environ.get("RLGEN_CACHE_DIR", "~/.cache/rlgen")).expanduser() / "vllm-kv"


def gpu_identity(devices: str) -> list[str] | None:
    """Name and total memory of each GPU this process sees, through NVML (no CUDA context); None when NVML
    cannot tell (then no size is stored or taken: a size is only valid for the GPU it was measured on)."""
    try:
        from vllm.third_party import pynvml
    except ImportError:
        return None
    ids = [0] if devices == "all" else gpu_indices(devices) or []  # [] where the devices are named by UUID
    if not ids:
        return None
    try:
        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - NVML missing or broken: start without a stored size
        return None
    try:
        out = []
        for i in ids:
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(h)
            out.append(f"{name.decode() if isinstance(name, bytes) else name}/{pynvml.nvmlDeviceGetMemoryInfo(h).total}")
        return out
    except Exception:  # noqa: BLE001
        return None
    finally:
        pynvml.nvmlShutdown()


def engine_versions() -> dict[str, str]:
    """vLLM's and torch's versions (both imported by then: the engine has started importing vLLM)."""
    import torch
    import vllm

    return {"vllm": str(vllm.__version__), "torch": str(torch.__version__)}


def size_key(args: Mapping[str, Any], config_text: str, versions: Mapping[str, str], gpus: list[str] | None) -> str:
    keyed = {k: v for k, v in sorted(args.items()) if k not in NOT_KEYED}
    blob = json.dumps({"args": keyed, "config": config_text, "versions": dict(versions), "gpus": gpus},
                      sort_keys=True, default=str)
    return hashlib.sha256(blob.encode()).hexdigest()[:24]


def token_bytes(config: Mapping[str, Any], dtype: str, tensor_parallel: int) -> int | None:
    """KV bytes of one token on one GPU of the engine (all layers), or None when config.json does not say."""
    layers, heads = config.get("num_hidden_layers"), config.get("num_attention_heads")
    kv_heads, hidden = config.get("num_key_value_heads", heads), config.get("hidden_size")
    head_dim = config.get("head_dim") or (hidden // heads if hidden and heads else None)
    size = DTYPE_BYTES.get(str(dtype).replace("torch.", ""))
    if not (layers and kv_heads and head_dim and size) or config.get("sliding_window") and config.get(
            "use_sliding_window"):
        return None
    return 2 * int(layers) * max(int(kv_heads) // max(int(tensor_parallel), 1), 1) * int(head_dim) * size


class KVSizes:
    """The stored KV size of one engine's setup, and its GPU's start lock."""

    def __init__(self, args: Mapping[str, Any], versions: Mapping[str, str], devices: str | None = None,
                 gpus: list[str] | None = None):
        """gpus: the GPUs' identity (gpu_identity() of devices when not given; None from it: nothing is stored)."""
        self.devices = visible_devices() if devices is None else devices
        path = Path(str(args["model"])) / "config.json"
        text = path.read_text() if path.is_file() else ""
        self.config = json.loads(text) if text else {}
        self.args = dict(args)
        gpus = gpu_identity(self.devices) if gpus is None else gpus
        self.enabled = gpus is not None
        self.key = size_key(args, text, versions, gpus)
        self.file = cache_dir() / f"{self.key}.json"
        self._held: Any = None  # the lock file while start_slot holds it
        self._guard = threading.Lock()

    def stored(self) -> int | None:
        if not self.enabled:
            return None
        try:
            value = int(json.loads(self.file.read_text())["kv_cache_memory_bytes"])
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return value if value > 0 else None

    def record(self, num_blocks: int | None, block_size: int | None) -> int | None:
        """Store the size vLLM measured (its block count); returns the bytes stored, or None when not storable."""
        per_token = self._token_bytes()
        if not (per_token and num_blocks and block_size):
            return None
        value = int(num_blocks) * int(block_size) * per_token
        return self._write(value, num_gpu_blocks=int(num_blocks), block_size=int(block_size))

    def _token_bytes(self) -> int | None:
        """KV bytes of a token when this setup's size can be stored, else None."""
        if not self.enabled or str(self.args.get("kv_cache_dtype", "auto")) != "auto":
            return None
        return token_bytes(self.config, self.args.get("dtype", "bfloat16"), int(self.args.get("tensor_parallel_size", 1)))

    def _write(self, value: int, **extra: Any) -> int | None:
        tmp = self.file.with_suffix(f".tmp{os.getpid()}")
        try:
            self.file.parent.mkdir(parents=True, exist_ok=True)
            tmp.write_text(json.dumps({"kv_cache_memory_bytes": value, **extra, "recorded": time.time()}) + "\n")
            os.replace(tmp, self.file)
        except OSError:  # an unwritable or full cache: the next start measures again, nothing else changes
            with contextlib.suppress(OSError):
                tmp.unlink()
            return None
        return value

    def hand_over(self, logged_gib: float) -> int | None:
        """The measuring engine's size, read from vLLM's log before its start ended: stored (rounded down to
        10 MiB, below vLLM's rounding), and the GPU's start lock released so the engines waiting for it start
        now. Returns the bytes stored, or None (nothing stored: the lock stays held until the start ends)."""
        value = int((float(logged_gib) - 0.01) * GIB) // (10 * 2**20) * (10 * 2**20)
        with self._guard:
            if (self._held is None or value <= 0 or not self._token_bytes()
                    or self._write(value, logged_gib=logged_gib) is None):
                return None
            self._release(self._held)
            self._held = None
        return value

    def forget(self) -> None:
        with contextlib.suppress(OSError):
            self.file.unlink()

    @contextlib.contextmanager
    def start_slot(self, name: str, timeout_s: float, given: bool = False) -> Iterator[int | None]:
        """Hold the start lock (rlgen.gpustart) of each of this engine's GPUs while it starts: shared with a
        stored size (yielded) or a given one (``given``: the engine's arguments carry it), alone without one (None
        is yielded, and the engine measures). Raises EngineError after timeout_s of waiting."""
        stored = self.stored()
        with contextlib.ExitStack() as stack:
            files = [stack.enter_context(open(path, "a+")) for path in lock_paths(self.devices)]
            deadline = time.time() + timeout_s
            for f in files:
                if not acquire(f, exclusive=not (stored or given), timeout_s=max(0.0, deadline - time.time())):
                    self._release(files)
                    raise EngineError(
                        f"{name} waited {timeout_s:.0f} s for another engine on GPU(s) {self.devices} to finish "
                        "starting; a stuck engine process may hold it (nvidia-smi lists it): stop it, or give "
                        "each engine its own GPU (engine.engines_per_gpu=1).")
            self._held = files
            try:
                # an engine that measured while this one waited stored the size: take it (still alone)
                yield stored or self.stored()
            finally:
                with self._guard:
                    if self._held is not None:
                        self._release(self._held)
                        self._held = None

    @staticmethod
    def _release(files: list[Any]) -> None:
        for f in files:
            fcntl.flock(f, fcntl.LOCK_UN)


class MeasuredWatch:
    """While a measuring engine starts, reads its process's log for vLLM's measured-size line and hands the
    GPU's start lock over (KVSizes.hand_over) once it appears. ``read`` returns the log's text; lines already
    in it when the watch begins are not counted (an earlier start in the same process)."""

    def __init__(self, sizes: KVSizes, read: Callable[[], str], poll_s: float = LOG_POLL_S):
        self.sizes, self.read, self.poll_s = sizes, read, poll_s
        self.handed: int | None = None
        self._seen = len(MEASURED_LINE.findall(read()))
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="rlgen-kv-watch", daemon=True)

    def __enter__(self) -> MeasuredWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(timeout=5)

    def _watch(self) -> None:
        while not self._stop.wait(self.poll_s):
            try:
                found = MEASURED_LINE.findall(self.read())
            except OSError:  # the log went away: the lock is released when the start ends, as without the watch
                return
            if len(found) > self._seen:
                self.handed = self.sizes.hand_over(float(found[self._seen]))
                return


__all__ = ["KVSizes", "MeasuredWatch", "cache_dir", "engine_versions", "size_key", "token_bytes"]
