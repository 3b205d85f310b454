"""Helpers the test modules share (pytest puts this folder on sys.path, beside conftest.py)."""

from __future__ import annotations

from rlgen.config import AlgoConfig

# what an algorithm preset needs beside it to plan: distillation's teacher (the student's own preset will do)
ALGO_NEEDS = {"distill": ["algo.teacher=tiny"]}


def algo_cfg(**values) -> AlgoConfig:
    """An AlgoConfig with concrete values where the dataclass leaves them null for the plan to fill: the tiny
    recipe's learning rate, 8 new tokens and one micro-batch of the whole batch."""
    return AlgoConfig(**{"lr": 1e-3, "max_new_tokens": 8, "micro_batch_tokens": 0, **values})


# The random Qwen2 models tests train and serve: TINY_QWEN2 on CPU (two 32-wide layers, 32 tokens), SMALL_QWEN2 on
# GPUs (four 512-wide layers, 2048 tokens, tied embeddings, sharper next-token distributions than the default init
# so greedy outputs are stable, special ids pad 0, eos 1, bos 2).
TINY_QWEN2 = {"vocab_size": 32, "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 2,
              "num_attention_heads": 4, "num_key_value_heads": 2}
SMALL_QWEN2 = {"vocab_size": 2048, "hidden_size": 512, "intermediate_size": 1408, "num_hidden_layers": 4,
               "num_attention_heads": 8, "num_key_value_heads": 2, "max_position_embeddings": 2048,
               "tie_word_embeddings": True, "initializer_range": 0.1, "pad_token_id": 0, "eos_token_id": 1,
               "bos_token_id": 2}


def tiny_qwen2(seed: int = 0, **config):
    """A random-init Qwen2 causal LM (float32) of TINY_QWEN2 with config's fields changed, drawn after
    torch.manual_seed(seed)."""
    import torch
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(seed)
    return AutoModelForCausalLM.from_config(Qwen2Config(**{**TINY_QWEN2, **config}))


def save_tiny_qwen2(path, seed: int = 0, **config) -> str:
    """tiny_qwen2(seed, **config) saved as a Hugging Face model folder at path; the folder's path."""
    tiny_qwen2(seed, **config).save_pretrained(path)
    return str(path)


def save_small_qwen2(path, seed: int = 0) -> str:
    """A random-init SMALL_QWEN2 model in bfloat16, with a generation config of its special ids, saved as a Hugging
    Face model folder at path (drawn after torch.manual_seed(seed)); the folder's path."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig, Qwen2Config

    torch.manual_seed(seed)
    model = AutoModelForCausalLM.from_config(Qwen2Config(**SMALL_QWEN2), dtype=torch.bfloat16)
    model.generation_config = GenerationConfig(eos_token_id=1, pad_token_id=0, bos_token_id=2)
    model.save_pretrained(path)
    return str(path)


def plan_problems(overrides: list[str]) -> list[str]:
    """The sentences of the PlanError the plan of the composed overrides raises (the test fails if it raises none)."""
    import pytest

    from rlgen.config.compose import compose_run_config
    from rlgen.plan import PlanError, build_plan

    with pytest.raises(PlanError) as info:
        build_plan(compose_run_config(overrides))
    return info.value.problems


MIN_REWARD_GAIN = 0.2  # what the embedded default run must learn by on a [0, 1] reward (make smoke)


def assert_learned(records: list[dict], summary: dict, min_gain: float = MIN_REWARD_GAIN) -> None:
    """The mean reward of the last fifth of the steps beats the first fifth's by min_gain, as the summary says."""
    import pytest

    k = len(records) // 5
    first = sum(r["reward_mean"] for r in records[:k]) / k
    last = sum(r["reward_mean"] for r in records[-k:]) / k
    assert last - first >= min_gain, f"reward rose only {first:.3f} -> {last:.3f}"
    assert summary["reward_gain"] == pytest.approx(last - first)


def even_answers_half(completion: str, answer: str) -> float:
    """A reward under which every group of an even answer is constant (0.5 whatever is sampled), and a group of an
    odd answer is scored by exact match: dynamic sampling must drop the first kind."""
    if int(answer) % 2 == 0:
        return 0.5
    return 1.0 if completion.strip() == answer.strip() else 0.0


def nan_on_even_answers(completion: str, answer: str) -> float:
    """Exact match, but NaN for every completion of a prompt whose answer is even (a broken reward function)."""
    if int(answer) % 2 == 0:
        return float("nan")
    return 1.0 if completion.strip() == answer.strip() else 0.0


def lora_model(base_dir: str, seed: int, rank: int = 4, scale: float = 0.3):
    """A PEFT model on the base folder with LoRA on every block linear and random lora_B (PEFT starts it at zero,
    which would leave the adapter without effect), in eval mode."""
    import torch
    from transformers import AutoModelForCausalLM

    from rlgen.config import LORA_BLOCK_LINEARS
    from rlgen.learners.lora import LoraSpec, wrap

    model = wrap(AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32),
                 LoraSpec(rank, 2.0 * rank, 0.0, LORA_BLOCK_LINEARS))
    nudge_lora(model, seed, scale)
    return model.eval()


def nudge_lora(peft_model, seed: int = 1, scale: float = 0.1) -> None:
    """Give a PEFT model's lora_B seeded random values times scale, in place (PEFT starts it at zero, which would
    leave the adapter without effect)."""
    import torch

    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in peft_model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * scale)


def lora_export(model, dtype=None) -> dict:
    """A PEFT model's adapter as a LoRA learner exports it: {"tensors", "config"}."""
    from rlgen.learners.lora import adapter_config, adapter_weights

    return {"tensors": adapter_weights(model, dtype), "config": adapter_config(model)}


def tiny_pool(engines: int = 2, *, chat: bool = False, max_model_len: int = 128, timeout_s: float = 60.0):
    """An EnginePool of in-process hf engines on the embedded default model (chat: with a ChatML template, which the
    tiny model's tokenizer lacks; a real model folder brings its own)."""
    import copy

    from rlgen.config import EngineConfig
    from rlgen.config.compose import compose_run_config
    from rlgen.engines.hf.engine import HFEngine
    from rlgen.models import load_tokenizer, prepare_model
    from rlgen.models.local import CHAT_TEMPLATE
    from rlgen.plan import build_plan
    from rlgen.serve.pool import EnginePool, ServedModel

    cfg = compose_run_config([])
    path = prepare_model(cfg)
    plan = build_plan(cfg)
    tok = load_tokenizer(path)
    if chat:
        tok = copy.deepcopy(tok)
        tok.chat_template = CHAT_TEMPLATE
    model = ServedModel("tiny", path, plan.model.params, plan.model.vocab_size, max_model_len, "hf", 1, tok)
    hf = [HFEngine(path, EngineConfig(dtype="float32"), seed=i, name=f"engine{i}") for i in range(engines)]
    return EnginePool(hf, model, timeout_s=timeout_s, local=True)


def serve_in_thread(app, header_timeout_s: float = 30.0):
    """uvicorn serving app on a free loopback port in a daemon thread, as `rlgen serve` runs it: a context manager
    that yields the URL and stops the server on exit."""
    import contextlib
    import socket
    import threading
    import time

    import uvicorn

    from rlgen.serve.server import server_config

    @contextlib.contextmanager
    def running():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        server = uvicorn.Server(server_config(app, "127.0.0.1", port, header_timeout_s))
        thread = threading.Thread(target=server.run, daemon=True)
        thread.start()
        deadline = time.time() + 30
        while not server.started and time.time() < deadline:
            time.sleep(0.05)
        try:
            yield f"http://127.0.0.1:{port}"
        finally:
            server.should_exit = True
            thread.join(10)

    return running()


def clip_loss(logp, engine_logp, advantages, mask, *, agg, denominator=None, token_weight=None, old_logp=None,
              loss="ppo_clip", **settings):
    """A registered policy loss on one micro-batch, as (loss, metrics): the AlgoConfig is algo_cfg with
    loss_agg=agg and the settings given (clip_low, tis_cap, importance_level, ...); old_logp None: pi_old is the
    engine's logprobs (old_logprobs=engine), else the trainer's (old_logprobs=trainer)."""
    from rlgen.algo.inputs import LossInputs
    from rlgen.algo.registry import policy_loss

    old = "engine" if old_logp is None else "trainer"
    algo = algo_cfg(loss_agg=agg, old_logprobs=old, **settings)
    inputs = LossInputs(logp=logp, old_logp=engine_logp if old_logp is None else old_logp, engine_logp=engine_logp,
                        advantages=advantages, mask=mask, token_weight=token_weight, denominator=denominator,
                        old_from_trainer=old_logp is not None)
    out = policy_loss(loss)(inputs, algo)
    return out.loss, out.metrics


# the per-step metrics a resumed or re-created run must reproduce exactly (to 1e-6) on CPU
EXACT = ("reward_mean", "reward_std", "loss", "pg_loss", "grad_norm", "entropy", "mismatch/k3_kl")


def assert_same_steps(records: list[dict], reference: list[dict], *, staleness: bool = True) -> None:
    """Every step of reference, once, in order, with EXACT metrics equal to 1e-6 and the same policy version
    (and staleness)."""
    assert [r["step"] for r in records] == [r["step"] for r in reference], "a step is missing or logged twice"
    for r, ref in zip(records, reference):
        for key in EXACT:
            assert abs(float(r[key]) - float(ref[key])) <= 1e-6, f"step {r['step']}: {key} {r[key]} != {ref[key]}"
        assert r["version"] == ref["version"] and (not staleness or r["staleness"] == ref["staleness"])


def train_or_stopped(overrides: list[str], out, *, stop=None, resume: bool = False):
    """`rlgen train` with these overrides into `out`, quietly, resuming the run there when asked: the RunStopped
    a stop request raised, or None when it finished."""
    from rich.console import Console

    from rlgen.config.compose import compose_run_config
    from rlgen.plan import build_plan
    from rlgen.runtime import RunStopped
    from rlgen.runtime.durability.resume import identity, resolve_explicit
    from rlgen.runtime.run import run_training

    plan = build_plan(compose_run_config(overrides))
    point = resolve_explicit(str(out), identity(plan.config, len(plan.learners))) if resume else None
    try:
        run_training(plan, out, Console(quiet=True), resume=point, stop=stop)
    except RunStopped as err:
        return err
    return None


def tokens_for(batch, rows: int) -> int:
    """A micro-batch budget (algo.micro_batch_tokens) of `rows` times the batch's longest packed row: micro-batches
    of about `rows` rows or fewer. 0 stays 0 (each rank's rows in one micro-batch)."""
    from rlgen.learners.packed import row_tokens

    return rows * max(row_tokens(batch.attention_mask, batch.response_mask, batch.prompt_len)) if rows else 0


def load_benchmark(name: str):
    """benchmarks/<name>.py as a module (the scripts are not a package), registered under bench_<name>."""
    import importlib.util
    import sys
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "benchmarks" / f"{name}.py"
    spec = importlib.util.spec_from_file_location(f"bench_{name}", path)
    mod = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = mod
    spec.loader.exec_module(mod)
    return mod
