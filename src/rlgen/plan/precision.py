"""The run's precision (``precision``, docs/correctness.md "Precision"): which 16-bit format the engines generate
in, the learners train in and the weights travel in, and whether the model fits fp16's range.

- ``bf16`` (the default): engines in bfloat16 (``engine.dtype`` null), DeepSpeed learners in bf16 with fp32
  master weights, the torch learner in float32.
- ``fp16``: engines in float16; learners in fp16 with fp32 master weights and dynamic loss scaling (DeepSpeed's
  fp16, torch's GradScaler on the torch learner); a step whose gradients overflow the scale is skipped and
  counted (``overflow_skip``), never taken for a non-finite one; weights go to the engines in float16 (the
  transport sends what the engines hold). GPUs only: on CPU the hf engine and the torch learner compute in
  float32, so fp16 is refused in a sentence.

A model.path folder is read before fp16 is allowed: a weight beyond fp16's largest finite value (65,504) is
refused by name; a folder saved in bfloat16 is noted, since its activations may overflow where its weights do
not (the loss scale then skips those steps, and ``overflow_skip`` counts them). Pure: safetensors headers and
tensors are read with numpy, not torch.
"""

from __future__ import annotations

import json
import struct
from pathlib import Path

from rlgen.config import Precision, RunConfig, Setting, set_key

FP16_MAX = 65504.0
ENGINE_DTYPE = {Precision.bf16: "bfloat16", Precision.fp16: "float16"}
HALF = ("float16", "half")


def resolve_precision(cfg: RunConfig, p: list[str]) -> tuple[RunConfig, list[Setting]]:
    """cfg with engine.dtype filled from precision where it is null; problems go to p; the settings to show."""
    precision = Precision(cfg.precision)
    gpus = cfg.hardware.gpus_per_node > 0
    settings: list[Setting] = []
    if precision is Precision.fp16 and not gpus:
        p.append("precision=fp16 is for GPUs: on CPU the hf engine and the torch learner compute in float32, which "
                 "fp16 would not change; leave precision out here, or run on GPUs (hardware=1xh100, ...).")
        return cfg, settings
    given = cfg.engine.dtype
    if given is None:
        value = ENGINE_DTYPE[precision] if gpus else "float32"
        cfg = set_key(cfg, "engine.dtype", value)
        settings.append(Setting("engine.dtype", value, f"derived: precision={precision.value}" if gpus else
                                "derived: the hf engine on CPU computes in float32"))
    elif precision is Precision.fp16 and given not in HALF:
        p.append(f"precision=fp16 generates in float16, but engine.dtype={given} was given; set engine.dtype=float16 "
                 "or leave it out (null: from precision).")
    if precision is Precision.fp16 and cfg.model.path and not p:
        settings.extend(_model_range(Path(cfg.model.path).expanduser(), p))
    return cfg, settings


def _model_range(folder: Path, p: list[str]) -> list[Setting]:
    """fp16's range against a model folder's weights: the largest |weight| of each safetensors file, read in
    chunks; a note where the folder was saved in bfloat16."""
    files = sorted(folder.glob("*.safetensors")) if folder.is_dir() else []
    if not files:
        return []
    over, saved, largest = [], set(), 0.0
    for f in files:
        for name, dtype, value in _largest(f):
            saved.add(dtype)
            largest = max(largest, value)
            if value > FP16_MAX:
                over.append(f"{name} ({value:.4g})")
    if over:
        p.append(f"precision=fp16: {len(over)} weight tensor(s) of {folder} hold values beyond fp16's largest, 65504: "
                 f"{', '.join(over[:3])}{' ...' if len(over) > 3 else ''}; this model trains in precision=bf16.")
        return []
    what = f"its largest weight is {largest:.4g}, within fp16's 65504"
    if "BF16" in saved:
        what += ("; saved in bfloat16, so its activations may still overflow fp16: the loss scale skips those "
                 "steps and overflow_skip counts them")
    return [Setting("model range", what, f"read from {folder.name}'s safetensors")]


_FORMATS = {"F32": "<f4", "F16": "<f2", "BF16": "<u2"}  # bfloat16 read as the high halves of float32s


def _largest(path: Path, chunk: int = 1 << 26):
    """(tensor name, safetensors dtype, its largest |value|) of each floating-point tensor of one file, mapped
    from disk a chunk of values at a time (numpy; about 2 s per GiB)."""
    import numpy as np

    with open(path, "rb") as fh:
        (size,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(size))
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + size)
    for name, meta in header.items():
        if name == "__metadata__" or meta.get("dtype") not in _FORMATS:
            continue
        start, end = meta["data_offsets"]
        values = data[start:end].view(_FORMATS[meta["dtype"]])
        top = 0.0
        for lo in range(0, values.size, chunk):
            part = values[lo: lo + chunk]
            if meta["dtype"] == "BF16":
                part = (part.astype(np.uint32) << 16).view(np.float32)
            top = max(top, float(np.abs(part).max(initial=0.0)))
        yield name, meta["dtype"], top


__all__ = ["FP16_MAX", "resolve_precision"]
