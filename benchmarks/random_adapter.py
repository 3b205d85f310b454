"""A PEFT LoRA adapter folder with random lora_B for a model preset, to check `rlgen validate` with an adapter that
changes the model. (A LoRA run on a random-init model gets no reward, so its adapter keeps PEFT's zero lora_B and
changes nothing.)

    python benchmarks/random_adapter.py OUT [--preset qwen2_5_0_5b] [--rank 16] [--scale 0.05] [--seed 0]

OUT gets adapter_config.json and adapter_model.safetensors, with LoRA on every block linear (the default of
learner.lora.target_modules) and alpha 2 x rank. It prints, as JSON, how far the adapter moves the model: the mean
and max |Δ logprob| of one random sequence's tokens with the adapter on and off, on the CPU in float32.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out", type=Path)
    ap.add_argument("--preset", default="qwen2_5_0_5b")
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--scale", type=float, default=0.05, help="standard deviation of lora_B's entries")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()

    import torch
    from transformers import AutoModelForCausalLM

    from rlgen.config import LORA_BLOCK_LINEARS
    from rlgen.config.compose import compose_run_config
    from rlgen.learners.lora import LoraSpec, wrap
    from rlgen.models import prepare_model

    folder = prepare_model(compose_run_config([f"model={args.preset}"]), device="cuda" if torch.cuda.is_available() else "cpu")
    model = wrap(AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32),
                 LoraSpec(args.rank, 2.0 * args.rank, 0.0, LORA_BLOCK_LINEARS))
    g = torch.Generator().manual_seed(args.seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * args.scale)
    model.eval().save_pretrained(str(args.out))

    ids = torch.randint(3, model.config.vocab_size, (1, 64), generator=g)
    with torch.no_grad():
        on = torch.log_softmax(model(ids).logits[0, :-1].float(), -1)
        with model.disable_adapter():
            off = torch.log_softmax(model(ids).logits[0, :-1].float(), -1)
    target = ids[0, 1:, None]
    delta = (on.gather(-1, target) - off.gather(-1, target)).abs()
    print(json.dumps({"adapter": str(args.out), "base": folder, "rank": args.rank, "scale": args.scale,
                      "moves_logprobs": {"mean_abs_delta": round(float(delta.mean()), 4),
                                         "max_abs_delta": round(float(delta.max()), 4)}}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
