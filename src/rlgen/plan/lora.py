"""LoRA in the plan: whether the learners train adapters rather than the whole model, with what rank and on which
layers, how the engines get the policy, and whether a starting adapter fits the base. Pure: JSON only, no torch or
peft (the learner imports peft when it is built).

Left unset (``learner.lora.enabled`` null), LoRA is on when a rank, target modules or a starting adapter is given, or when full
fine-tuning cannot fit the learner GPUs even at a micro-batch of one beside a sleeping engine: then it is the only
way to train on this hardware, and the plan says so in the setting's source.
"""

from __future__ import annotations

import importlib.util
import json
import re
import struct
from pathlib import Path

from rlgen.adapter_folder import read_adapter_config
from rlgen.config import LORA_BLOCK_LINEARS, LORA_DEFAULT_RANK, LoraSync, RunConfig, Setting, set_key
from rlgen.engines.registry import EngineSpec
from rlgen.plan.memory import block_linears, full_finetune_fits


def resolve_lora(cfg: RunConfig, spec: EngineSpec, model, ranks: int, per_rank: int, colocated: bool,
                 zero_from_recipe: bool, p: list[str]) -> tuple[RunConfig, list[Setting]]:
    """cfg with learner.lora resolved: enabled, rank, alpha, target_modules and sync filled; problems go to p.
    zero_from_recipe: learner.zero_stage came from the recipe (a recipe's 3 is for full fine-tuning's optimizer
    state, which LoRA does not have, so LoRA sets 2)."""
    lc = cfg.learner.lora
    cfg, settings = _enabled(cfg, spec, model, ranks, per_rank, colocated)
    if cfg.learner.lora.enabled and cfg.learner.zero_stage == 3 and zero_from_recipe:
        cfg = set_key(cfg, "learner.zero_stage", 2)
        settings.append(Setting("learner.zero_stage", 2, "derived: LoRA (the frozen base is whole on every rank; the "
                                "adapters' optimizer state is small)"))
    if not cfg.learner.lora.enabled:  # a key set for nothing is refused with the others (plan/checks/ignored.py)
        return cfg, settings
    init = _read_init(lc.init, p) if lc.init else None
    if lc.rank is not None and lc.rank < 1:
        p.append(f"learner.lora.rank={lc.rank}: a LoRA rank is a positive whole number (8 to 64 are usual); leave it "
                 f"unset for {LORA_DEFAULT_RANK}, or set learner.lora.enabled=false to train the whole model.")
        return cfg, settings
    if init is not None and init.get("r"):
        rank, why = int(init["r"]), "learner.lora.init's adapter_config.json"
    else:
        rank, why = (lc.rank, "config") if lc.rank is not None else (LORA_DEFAULT_RANK, "default")
    alpha = lc.alpha if lc.alpha is not None else float(init.get("lora_alpha") if init else 2 * rank)
    if alpha <= 0:
        p.append(f"learner.lora.alpha={alpha} must be positive (the adapters are scaled by alpha / rank); leave it "
                 "unset for 2 x rank.")
    if not 0.0 <= lc.dropout < 1.0:
        p.append(f"learner.lora.dropout={lc.dropout} must be in [0, 1).")
    saved = (init or {}).get("target_modules") or []
    targets = list(lc.target_modules) or ([saved] if isinstance(saved, str) else list(saved)) or list(LORA_BLOCK_LINEARS)
    unknown = [t for t in targets if t not in LORA_BLOCK_LINEARS]
    if unknown:
        p.append(f"learner.lora.target_modules names {unknown}, which the model's blocks do not have; its linear layers "
                 f"are {list(LORA_BLOCK_LINEARS)} (leave it empty for all of them).")
    sync, sync_why = _sync(cfg, spec, rank, p)
    if cfg.learner.zero_stage == 3:
        p.append("LoRA trains on ZeRO stage 2 here (the frozen base is whole on every rank, the adapters' state is "
                 "small); set learner.zero_stage=2 or leave it unset.")
    if sync is LoraSync.adapter and colocated and cfg.sync.sleep_level == 2:
        p.append("learner.lora.sync=adapter keeps the base on the engines, which sync.sleep_level=2 drops; use "
                 "sync.sleep_level=1 or learner.lora.sync=merged.")
    if importlib.util.find_spec("peft") is None:
        p.append("LoRA needs the peft package, which is not installed: pip install 'rlgen[lora]'.")
    if init is not None:
        _check_init_shapes(cfg, lc.init, p)
    alpha_why = ("config" if lc.alpha is not None else "learner.lora.init's adapter_config.json"
                 if init and init.get("lora_alpha") else "derived: 2 x rank")
    for key, value, source in (("learner.lora.rank", rank, why), ("learner.lora.alpha", alpha, alpha_why),
                               ("learner.lora.target_modules", targets,
                                "config" if lc.target_modules else "default: every linear layer of the blocks"),
                               ("learner.lora.sync", sync.value, sync_why)):
        cfg = set_key(cfg, key, value)
        settings.append(Setting(key, value, source))
    return cfg, settings


def _enabled(cfg: RunConfig, spec: EngineSpec, model, ranks: int, per_rank: int,
             colocated: bool) -> tuple[RunConfig, list[Setting]]:
    lc = cfg.learner.lora
    if lc.enabled is not None:
        return cfg, [Setting("learner.lora.enabled", lc.enabled, "config")]
    given = [k for k, v in (("rank", lc.rank is not None), ("init", bool(lc.init)),
                            ("target_modules", bool(lc.target_modules))) if v]
    if given:
        on, why = True, f"derived: learner.lora.{given[0]} is set"
    elif cfg.hardware.gpus_per_node == 0 or not per_rank:
        on, why = False, "default: full fine-tuning"
    else:
        fits, peak, room = full_finetune_fits(cfg, spec, model, ranks, per_rank, colocated)
        on = not fits
        why = (f"derived: full fine-tuning needs about {peak:.0f} GiB per learner rank even at a micro-batch of 1, "
               f"more than the {room:.0f} GiB it can have, so the adapters train on the frozen base" if on
               else "derived: full fine-tuning fits the learner GPUs")
    cfg = set_key(cfg, "learner.lora.enabled", on)
    return cfg, [Setting("learner.lora.enabled", on, why)]


def _sync(cfg: RunConfig, spec: EngineSpec, rank: int, p: list[str]) -> tuple[LoraSync, str]:
    """How the engines get the policy, and why."""
    sync = LoraSync(cfg.learner.lora.sync)
    cannot = _no_adapters(cfg, spec, rank)
    if sync is LoraSync.adapter and cannot:
        p.append(f"learner.lora.sync=adapter needs engines that take LoRA adapters, but {cannot}; use "
                 "learner.lora.sync=merged (or auto).")
    if sync is not LoraSync.auto:
        return sync, "config"
    if cannot:
        return LoraSync.merged, f"derived: {cannot}, so the learner merges the adapters in"
    if spec.served:
        return LoraSync.adapter, (f"derived: engine={spec.kind} holds the base and takes each adapter version "
                                  "(megabytes over the network, not the whole model)")
    if cfg.hardware.gpus_per_node == 0:
        return LoraSync.merged, ("derived: on CPU the merged weights are small and generation without LoRA layers is "
                                 "faster")
    return LoraSync.merged, (f"derived: merged weights ran faster than engine={spec.kind}'s adapters in a side-by-side "
                             "on one H100 (1.5B: step 1.31x, generation 1.26x, update 2.2x; docs/benchmarks.md); "
                             "learner.lora.sync=adapter sends only the adapters")


def _no_adapters(cfg: RunConfig, spec: EngineSpec, rank: int) -> str | None:
    """Why the run's engines cannot take adapters of this rank; None when they can."""
    room = cfg.engine.max_lora_rank
    if not spec.adapters:
        return f"engine={spec.kind} takes whole weights only"
    if spec.served and room == 0:
        return (f"the server at {cfg.engine.url} was started without LoRA (restart it with "
                f"engine.max_lora_rank={rank} or more to send adapters)")
    if room is not None and room < rank:
        where = f"the server at {cfg.engine.url}" if spec.served else "the engines"
        return (f"{where} take adapters up to rank {room} (engine.max_lora_rank), and this adapter has rank {rank}; "
                f"raise engine.max_lora_rank to {rank} or lower learner.lora.rank")
    return None


def _read_init(path: str, p: list[str]) -> dict | None:
    config, why = read_adapter_config(path)
    if why:
        p.append(f"learner.lora.init={path} {why}; point it at the folder an adapter was saved to, such as a LoRA "
                 "run's final_model/.")
    return config


_KEY = re.compile(r"layers\.(\d+)\..*?\.(\w+)\.lora_([AB])\.weight$")


def safetensors_shapes(path: Path) -> dict[str, list[int]]:
    """{tensor name: shape} from a safetensors file's header (no tensor is read)."""
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    return {k: v["shape"] for k, v in header.items() if k != "__metadata__"}


def _check_init_shapes(cfg: RunConfig, path: str, p: list[str]) -> None:
    """Every adapter tensor of learner.lora.init fits a layer of this base model."""
    why = adapter_misfit(cfg.model, path)
    if why:
        p.append(f"learner.lora.init={path} {why}")


def adapter_misfit(model, path: str) -> str | None:
    """Why the PEFT adapter folder at path does not fit a model of shape ``model`` (a ModelConfig), as the end of a
    sentence that starts with the folder; None when every adapter tensor fits a layer. Reads file headers only."""
    file = Path(path).expanduser() / "adapter_model.safetensors"
    if not file.is_file():
        return "has no adapter_model.safetensors; point it at a complete adapter folder."
    try:
        shapes = safetensors_shapes(file)
    except (OSError, ValueError, struct.error) as err:
        return f"has an adapter_model.safetensors that cannot be read ({err})."
    for key, shape in sorted(shapes.items()):
        found = _KEY.search(key)
        if not found:
            continue
        layer, module, ab = int(found.group(1)), found.group(2), found.group(3)
        dims = block_linears(model).get(module)
        if layer >= model.num_layers or dims is None:
            return (f"holds an adapter for another base model: it has {key}, which {model.name} ({model.num_layers} "
                    "layers) does not; use an adapter trained on this model.")
        want_in, want_out = dims
        if (ab == "A" and shape[-1] != want_in) or (ab == "B" and shape[0] != want_out):
            return (f"holds an adapter for another base model: its {key} has shape {shape}, but {module} of "
                    f"{model.name} maps {want_in} to {want_out} features; use an adapter trained on this model.")
    return None


__all__ = ["adapter_misfit", "resolve_lora", "safetensors_shapes"]
