"""GRPO settings that fit the model's size: the values a config leaves null (auto) come from here.

A recipe is chosen by the parameter count the plan computes from the model's shape (a preset, or the
config.json of model.path), so a local Qwen2.5-7B folder gets the 7B settings whatever preset name it runs
under. A value set in the config or on the command line always wins. Pure: no torch.
"""

from __future__ import annotations

from dataclasses import dataclass

from rlgen.config import RunConfig, Setting, get_key, set_key


@dataclass(frozen=True)
class Recipe:
    name: str
    below_params: float  # the recipe covers models with fewer parameters than this
    max_new_tokens: int
    lr: float
    # the most packed tokens in a learner micro-batch (raised to the longest row where that is more); 0: a rank's
    # rows in one. On GPU the plan takes the most that fits memory under it. Each micro-batch costs about 0.35 s of
    # kernel launches and ZeRO hooks at 1.5B whatever its size (docs/benchmarks.md, "Learner micro-batches"), so
    # fewer, larger ones train faster. At 1.5B on one H200, 32k and 64k tokens a micro-batch trained equally fast
    # (1.34 and 1.32 s for 39k tokens), and what the learner does not take, a colocated engine's KV cache gets.
    micro_batch_tokens: int
    gradient_checkpointing: bool
    zero_stage: int


# Response lengths and learning rates follow common open GRPO recipes for Qwen2.5 at these sizes (1e-6 with
# AdamW, 0.5-1k-token answers for math); micro-batches and ZeRO stages follow from memory on 80 GB GPUs. Going
# from 8 to 32 rows of 312 tokens a micro-batch took a 1.5B learner step from 5.7 s to 1.8 s on one H100. The two
# smallest are for the character-tokenizer presets on synthetic tasks: at 2.4M parameters (model=small) RL at 1e-3
# collapsed the policy within ten steps on CPU, and 1e-4 learned.
RECIPES: tuple[Recipe, ...] = (
    Recipe("tiny", 1e6, max_new_tokens=4, lr=1e-3, micro_batch_tokens=0, gradient_checkpointing=False, zero_stage=2),
    Recipe("small", 1e8, max_new_tokens=4, lr=1e-4, micro_batch_tokens=0, gradient_checkpointing=False, zero_stage=2),
    Recipe("0.5B", 1e9, max_new_tokens=512, lr=1e-6, micro_batch_tokens=32768, gradient_checkpointing=True, zero_stage=2),
    Recipe("1.5B", 4e9, max_new_tokens=1024, lr=1e-6, micro_batch_tokens=32768, gradient_checkpointing=True, zero_stage=2),
    Recipe("7B", 2e10, max_new_tokens=1024, lr=1e-6, micro_batch_tokens=16384, gradient_checkpointing=True, zero_stage=3),
    Recipe("large", float("inf"), max_new_tokens=1024, lr=5e-7, micro_batch_tokens=8192, gradient_checkpointing=True,
           zero_stage=3),
)

# (config key, Recipe field) for the values a recipe fills
RECIPE_KEYS: tuple[tuple[str, str], ...] = (
    ("algo.max_new_tokens", "max_new_tokens"),
    ("algo.lr", "lr"),
    ("learner.gradient_checkpointing", "gradient_checkpointing"),
    ("learner.zero_stage", "zero_stage"),
)


def recipe_for(params: int) -> Recipe:
    return next(r for r in RECIPES if params < r.below_params)


def fill_recipe(cfg: RunConfig, params: int) -> tuple[RunConfig, list[Setting]]:
    """cfg with its null recipe keys filled for a model of `params` parameters, and one Setting per key."""
    recipe = recipe_for(params)
    settings: list[Setting] = []
    for key, field in RECIPE_KEYS:
        value = get_key(cfg, key)
        if value is None:
            value = getattr(recipe, field)
            cfg = set_key(cfg, key, value)
            size = f"{params / 1e9:.2f}B" if params >= 1e8 else f"{params / 1e6:.2f}M"
            settings.append(Setting(key, value, f"recipe {recipe.name} ({size} params)"))
        else:
            settings.append(Setting(key, value, "config"))
    return cfg, settings


__all__ = ["RECIPES", "Recipe", "Setting", "fill_recipe", "get_key", "recipe_for", "set_key"]
