"""Why a vLLM engine could not start, in one sentence with its fix.

vLLM reports a failed start as "Engine core initialization failed. See root cause above": the cause is printed
by its engine-core process to the actor's stderr, which Ray keeps in the session's log folder. The engine actor
checks that it has a GPU and vllm and enough free GPU memory before it starts vLLM, and after a failure reads its
own stderr log and matches the errors vLLM 0.26 raises. No torch or vllm import at module level.
"""

from __future__ import annotations

import glob
import os
import re
from collections.abc import Callable

from rlgen.engines.base import EngineStartError
from rlgen.engines.vllm.common import EngineError
from rlgen.gpustart import gpu_indices, visible_devices

GIB = 2**30


def require_cuda_and_vllm() -> None:
    """Raise EngineError unless this process sees a CUDA GPU and can import vllm."""
    import torch

    if not torch.cuda.is_available():
        raise EngineError(
            "engine=vllm needs a CUDA GPU, but this process sees none (torch.cuda.is_available() is False). "
            "Use engine=hf on CPU, or run on a GPU machine; under Ray, start the engine actor with "
            "num_gpus equal to engine.tensor_parallel_size."
        )
    try:
        import vllm  # noqa: F401
    except ImportError as err:
        raise EngineError(
            "engine=vllm needs the vllm package (vLLM 0.26): pip install 'rlgen[gpu]'. "
            f"Importing it failed with: {err}"
        ) from err


def prepare_process(env: dict[str, str] | None) -> None:
    """What a vLLM engine's process does first, before it needs its model folder: the engine's environment (and
    REQUIRED_ENV, unless set), then torch's check for a GPU through NVML and vllm's import, without initializing
    CUDA (the engine core is forked from this process). A problem is left to the engine's own start, which says
    it in its words."""
    from rlgen.engines.vllm.args import REQUIRED_ENV

    os.environ.update({k: str(v) for k, v in (env or {}).items()})
    for k, v in REQUIRED_ENV.items():
        os.environ.setdefault(k, v)
    try:
        require_cuda_and_vllm()
    except EngineError:
        pass


def _free_memory(m: re.Match) -> str:
    return free_memory_sentence(*(float(x) for x in m.groups()))


def free_memory_sentence(free: float, total: float, want: float, want_gib: float) -> str:
    return (f"only {free:.1f} of the GPU's {total:.1f} GiB were free when vLLM started, less than the "
            f"{want_gib:.1f} GiB that engine.gpu_memory_utilization={want:g} asks for (another process, such as a "
            f"colocated learner, holds the rest); leave engine.gpu_memory_utilization unset so the plan derives it "
            f"from the learner's footprint, or set it to {max(free / total - 0.05, 0.05):.2f} or less.")


def _max_len(m: re.Match) -> str:
    want, fits = m.group(1), m.group(2)
    return (f"the engine's KV cache cannot hold one {want}-token sequence (about {fits} tokens fit); lower "
            f"engine.max_model_len to {fits} or less, raise engine.gpu_memory_utilization, or use a larger "
            "engine.tensor_parallel_size.")


def _module(m: re.Match) -> str:
    mod = m.group(1)
    extra = (" or keep VLLM_USE_FLASHINFER_SAMPLER=0 in engine.env, which avoids it" if mod.startswith("flashinfer")
             else "")
    return f"vLLM needs the Python package {mod!r}, which is not installed where the engine runs; install it{extra}."


# (pattern over vLLM's stderr, the sentence it becomes); the first that matches wins
CAUSES: tuple[tuple[re.Pattern, Callable[[re.Match], str]], ...] = (
    (re.compile(r"Free memory on device \S+ \(([\d.]+)/([\d.]+) GiB\) on startup is less than desired GPU memory "
                r"utilization \(([\d.]+), ([\d.]+) GiB\)"), _free_memory),
    (re.compile(r"max seq len \((\d+)\).*?estimated maximum model length is (\d+)", re.S), _max_len),
    (re.compile(r"No available memory for the cache blocks"),
     lambda m: ("weights and activations take all of the engine's memory share and leave nothing for the KV cache; "
                "raise engine.gpu_memory_utilization, use a larger engine.tensor_parallel_size, or a smaller model.")),
    (re.compile(r"OutOfMemoryError: CUDA out of memory\. Tried to allocate ([\d.]+ [GM]iB)"),
     lambda m: (f"the GPU ran out of memory while the engine started (it asked for {m.group(1)} more); lower "
                "engine.gpu_memory_utilization, or give engines their own GPUs (hardware.colocated=false).")),
    (re.compile(r"Bfloat16 is only supported on GPUs with compute capability of at least 8\.0"),
     lambda m: "this GPU cannot run bf16; set engine.dtype=float16."),
    (re.compile(r"No module named '([\w.]+)'"), _module),
)


def explain(text: str) -> str | None:
    """The sentence for the first known cause in vLLM's output, or None."""
    for pattern, sentence in CAUSES:
        m = pattern.search(text)
        if m:
            return sentence(m)
    return None


def own_stderr_tail(max_bytes: int = 400_000, stream: str = "err") -> str:
    """The end of this Ray worker's stderr log (where vLLM's engine core prints its errors), or "" outside Ray;
    stream="out": its stdout log (where vLLM's logger prints)."""
    try:
        import ray

        logs = ray._private.worker.global_worker.node.get_logs_dir_path()  # noqa: SLF001 - no public accessor
    except Exception:  # noqa: BLE001 - not in a Ray worker, or Ray changed: no log to read
        return ""
    texts = []
    for path in glob.glob(os.path.join(logs, f"worker-*-{os.getpid()}.{stream}")):
        with open(path, "rb") as f:
            f.seek(max(0, os.path.getsize(path) - max_bytes))
            texts.append(f.read().decode("utf-8", "replace"))
    return "\n".join(texts)


def visible_gpus() -> list[int]:
    """NVML indices of the GPUs this process sees (CUDA_VISIBLE_DEVICES as integers; [] when it is unset or names
    UUIDs)."""
    return gpu_indices(visible_devices()) or []


def own_logs() -> str:
    """This Ray worker's stdout and stderr logs (vLLM's logger prints to the first, its errors go to the second)."""
    return own_stderr_tail(stream="out") + "\n" + own_stderr_tail()


def check_free_memory(name: str, utilization: float, gpus: list[int] | None = None) -> None:
    """Raise EngineStartError when a GPU of this engine has less free memory than vLLM will ask for. Read through
    NVML, so no CUDA context is made in this process; skipped where NVML is not importable."""
    try:
        from vllm.third_party import pynvml
    except ImportError:
        return
    gpus = visible_gpus() if gpus is None else gpus
    if not gpus:
        return
    pynvml.nvmlInit()
    try:
        for index in gpus:
            info = pynvml.nvmlDeviceGetMemoryInfo(pynvml.nvmlDeviceGetHandleByIndex(index))
            free, total = info.free / GIB, info.total / GIB
            if free < utilization * total:
                raise EngineStartError(name, free_memory_sentence(free, total, utilization, utilization * total))
    finally:
        pynvml.nvmlShutdown()


__all__ = ["EngineStartError", "check_free_memory", "explain", "own_logs", "own_stderr_tail", "prepare_process",
           "require_cuda_and_vllm"]
