"""`rlgen validate` with a LoRA adapter (``learner.lora.init=<adapter folder>``): the reference runs the base with
the adapter through PEFT, and the candidate gets the policy the way a run would send it, as the adapter itself
(``learner.lora.sync=adapter``: vLLM's LoRA kernels) or as the base with the adapter merged in (``merged``). So
the check covers both ways a LoRA policy reaches an engine. A server's engines (``engine=remote``) serve other
clients too, so they load the adapter by name for the check and unload it after; merged weights are refused there."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from rlgen.config import Transport
from rlgen.engines.contract import UsesNamedAdapter, require
from rlgen.plan import PlanError


def policy_adapter(plan: Any) -> dict[str, Any] | None:
    """The starting adapter of the plan ({"tensors", "config"}), or None without one."""
    lora = plan.config.learner.lora
    if not lora.enabled or not lora.init:
        return None
    from rlgen.engines.hf.adapters import read_adapter_folder

    return read_adapter_folder(str(lora.init))


def merged_policy(model_path: str, folder: str, device: str, dtype_name: str) -> dict[str, Any]:
    """The base at model_path with the adapter in folder merged in, under the base's names (CPU tensors): what a
    LoRA learner sends under learner.lora.sync=merged."""
    import torch
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from rlgen.learners.lora import ADAPTER, merged_weights

    dtype = getattr(torch, dtype_name) if device != "cpu" and dtype_name in ("bfloat16", "float16") else torch.float32
    base = AutoModelForCausalLM.from_pretrained(model_path, dtype=dtype).to(device)
    model = PeftModel.from_pretrained(base, folder, adapter_name=ADAPTER)
    out = {name: t.to("cpu") for name, t in merged_weights(model)}
    del model, base
    if device != "cpu":
        torch.cuda.empty_cache()
    return out


def refuse_on_a_server(plan: Any) -> None:
    """A server's engines serve other clients too: validate gives them an adapter by name and drops it after, but
    merged weights would replace what the server serves, so that is refused (PlanError) before anything starts, as
    is a served kind that does not claim UsesNamedAdapter (CapabilityMissing)."""

    init = plan.config.learner.lora.init
    if plan.engine.served and init and plan.transport is not Transport.lora_adapter:
        raise PlanError([f"validating learner.lora.init={init} merged into the weights would replace the weights the "
                         f"server at {plan.config.engine.url} serves; use learner.lora.sync=adapter (the server loads "
                         "the adapter by name for the check and unloads it after), on a server started with "
                         "engine.max_lora_rank."])
    if plan.engine.served and init and plan.config.learner.lora.enabled:  # give_policy loads it by name
        require(plan.engine, UsesNamedAdapter, f"validating learner.lora.init={init} on a server's engines")


def give_policy(plan: Any, model_path: str, device: str, reference: Any,
                candidate: Any) -> tuple[str | None, Callable[[], None] | None]:
    """Load the plan's starting adapter into the reference, and into the candidate the way the plan sends it;
    returns how the candidate got it (None: no adapter) and what undoes it on a server (None: nothing to undo)."""
    adapter = policy_adapter(plan)
    if adapter is None:
        return None, None
    reference.call("load_adapter", adapter, 0)
    init = plan.config.learner.lora.init
    if plan.engine.served:  # by name from its folder, so the server's own policy stays (refuse_on_a_server)
        name = candidate.call("use_named_adapter", str(init))
        return (f"LoRA adapter {init} as an adapter, loaded by name ({name}) and unloaded after",
                lambda: candidate.call("drop_named_adapter"))
    if plan.transport is Transport.lora_adapter:
        candidate.call("load_adapter", adapter, 0)
        return f"LoRA adapter {init} as an adapter", None
    merged = merged_policy(model_path, str(init), device, str(plan.config.engine.dtype))
    candidate.call("update_weights", merged, 0)
    return f"LoRA adapter {init} merged into the weights", None
