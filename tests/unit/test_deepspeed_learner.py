"""DeepSpeedLearner on CPU: its DeepSpeed config, its GRPO step against TorchLearner's, its non-finite guard
and its ZeRO-3 bucketed weight export.

deepspeed is not needed: the step runs around ``ZeroStandIn``, which does what DeepSpeed's engine does for
this learner (backward accumulates; step() at the boundary skips and clears non-finite gradients, else
clips and steps), and the ZeRO-3 gather runs under a stand-in ``deepspeed.zero.GatheredParameters``. The real
engine runs in tests/gpu/test_weight_sync.py.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest
import torch
from transformers import Qwen2ForCausalLM

from helpers import algo_cfg, save_tiny_qwen2, tokens_for
from rlgen.algo.advantages import group_advantages
from rlgen.config import AlgoConfig, LossAgg, MonitorConfig
from rlgen.learners.attention import use_packed_attention
from rlgen.learners.deepspeed import DeepSpeedLearner, build_ds_config
from rlgen.learners.packed import row_tokens
from rlgen.learners.torch import NonFiniteWeightsError, TorchLearner
from rlgen.microbatches import assign
from rlgen.sync.waits import SyncError
from rlgen.types import RolloutBatch

PROMPTS = [[5, 6, 7], [5, 6, 7], [9, 4, 11, 3], [9, 4, 11, 3]]
RESPONSES = [[12, 13, 14], [15, 16], [17, 18, 19, 20], [21]]



@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    return save_tiny_qwen2(tmp_path_factory.mktemp("qwen2-ds"))


def make_batch(engine_shift: float = -0.1, advantages=None) -> RolloutBatch:
    """Left-padded prompts [4, P=4], right-padded responses [4, L=4]; engine logprobs a constant off."""
    p_len, r_len = 4, 4
    ids, attn, rmask, elp = [], [], [], []
    for prompt, resp in zip(PROMPTS, RESPONSES):
        left, right = p_len - len(prompt), r_len - len(resp)
        ids.append([0] * left + prompt + resp + [0] * right)
        attn.append([0] * left + [1] * (len(prompt) + len(resp)) + [0] * right)
        rmask.append([1.0] * len(resp) + [0.0] * right)
        elp.append([-3.0 + engine_shift] * len(resp) + [0.0] * right)
    rewards = torch.tensor([1.0, 0.0, 0.0, 1.0])
    groups = torch.tensor([0, 0, 1, 1])
    adv = group_advantages(rewards, groups) if advantages is None else torch.tensor(advantages)
    return RolloutBatch(input_ids=torch.tensor(ids), attention_mask=torch.tensor(attn),
                        response_mask=torch.tensor(rmask), engine_logprobs=torch.tensor(elp), rewards=rewards,
                        advantages=adv.float(), group_ids=groups, version=0, prompt_len=p_len)


class ZeroStandIn:
    """The slice of DeepSpeedEngine the learner uses, with ZeRO's overflow behaviour (read from DeepSpeed
    0.19.8): at the boundary a non-finite gradient norm skips the step and clears the gradients."""

    def __init__(self, module, lr, grad_clip):
        self.module = module
        self.optimizer = torch.optim.AdamW(module.parameters(), lr=lr, weight_decay=0.0)
        self.grad_clip = grad_clip
        self.boundary, self.applied, self.norm, self.backwards, self.grads = None, False, None, [], {}

    def __call__(self, **kwargs):
        return self.module(**kwargs)

    def set_gradient_accumulation_boundary(self, flag):
        self.boundary = flag

    def backward(self, loss, scale_wrt_gas=True):
        assert scale_wrt_gas is False
        self.backwards.append(self.boundary)
        loss.backward()

    def step(self):
        assert self.boundary is True, "step() only at the accumulation boundary"
        params = [p for p in self.module.parameters() if p.grad is not None]
        self.grads = {n: p.grad.clone() for n, p in self.module.named_parameters() if p.grad is not None}
        norm = float(torch.nn.utils.clip_grad_norm_(params, self.grad_clip if self.grad_clip > 0 else math.inf))
        self.applied = math.isfinite(norm)
        self.norm = norm if self.applied else math.inf
        if self.applied:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def get_global_grad_norm(self):
        return self.norm

    def was_step_applied(self):
        return self.applied


def ds_learner(model_dir: str, algo: AlgoConfig) -> DeepSpeedLearner:
    learner = DeepSpeedLearner.__new__(DeepSpeedLearner)
    learner._init_state(algo, MonitorConfig(), 0, "learner0", torch.device("cpu"), 2, 1 << 20)
    module = Qwen2ForCausalLM.from_pretrained(model_dir, dtype=torch.float32).train()
    use_packed_attention(module, "sdpa_segments")
    learner.engine = learner.model = ZeroStandIn(module, algo.lr, algo.grad_clip)
    learner.module = module
    return learner


def params(module):
    return {k: v.detach().clone() for k, v in module.named_parameters()}


# -- config ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("stage", [2, 3])
def test_ds_config_geometry_and_precision(stage):
    # a step's micro-batches are as many as its tokens need; the learner marks the boundary itself
    cfg = build_ds_config(algo_cfg(micro_batch_tokens=4096, grad_clip=1.0), zero_stage=stage)
    assert cfg["train_micro_batch_size_per_gpu"] == 1
    assert cfg["gradient_accumulation_steps"] == 1
    assert cfg["train_batch_size"] == 1
    assert cfg["gradient_clipping"] == 1.0
    assert cfg["bf16"] == {"enabled": True, "check_grad_overflow": True}  # the non-finite guard relies on it
    assert cfg["zero_optimization"]["stage"] == stage
    assert ("stage3_gather_16bit_weights_on_model_save" in cfg["zero_optimization"]) == (stage == 3)
    assert cfg["zero_allow_untested_optimizer"] is True


def test_ds_config_whole_batch_and_no_clipping():
    cfg = build_ds_config(algo_cfg(micro_batch_tokens=0, grad_clip=0.0), zero_stage=3, world_size=2)
    assert cfg["train_micro_batch_size_per_gpu"] == 1 and cfg["gradient_accumulation_steps"] == 1
    assert cfg["train_batch_size"] == 2 and cfg["gradient_clipping"] == 0.0


@pytest.mark.parametrize("stage", [0, 1, 4])
def test_ds_config_rejects_other_stages(stage):
    with pytest.raises(ValueError, match="zero_stage"):
        build_ds_config(algo_cfg(), zero_stage=stage)


def test_importing_the_learner_and_sync_needs_neither_deepspeed_nor_vllm():
    code = ("import sys, rlgen.learners.deepspeed, rlgen.sync.transports; "
            "print(sorted(m for m in ('deepspeed', 'vllm') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_the_learners_hold_one_core_and_neither_inherits_the_other(model_dir):
    from rlgen.learners.actor import LearnerActor
    from rlgen.learners.step_core import StepCore

    assert not issubclass(DeepSpeedLearner, TorchLearner) and not issubclass(TorchLearner, DeepSpeedLearner)
    assert issubclass(DeepSpeedLearner, LearnerActor) and issubclass(TorchLearner, LearnerActor)
    for cls in (DeepSpeedLearner, TorchLearner):
        assert vars(cls).get("__doc__") and cls.__doc__ != LearnerActor.__doc__, cls  # a docstring of its own
    assert (TorchLearner.replicas, DeepSpeedLearner.replicas) == (True, False)
    assert type(ds_learner(model_dir, algo_cfg()).core) is StepCore
    assert type(TorchLearner(model_dir, algo_cfg(), MonitorConfig()).core) is StepCore


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the CPU error path")
def test_construction_without_cuda_says_what_to_use(model_dir):
    with pytest.raises(RuntimeError, match="CUDA GPU"):
        DeepSpeedLearner(model_dir, algo_cfg(), MonitorConfig())


# -- the step against TorchLearner's --------------------------------------------------------------------------
@pytest.mark.parametrize(
    "agg,micro,seq_mask_cap,old",
    [(LossAgg.token_mean, 0, 0.0, "engine"), (LossAgg.token_mean, 1, 0.0, "engine"),
     (LossAgg.seq_mean_token_mean, 2, 0.0, "engine"), (LossAgg.seq_mean_token_sum_norm, 1, 0.0, "engine"),
     (LossAgg.token_mean, 2, 1.05, "engine"), (LossAgg.token_mean, 2, 0.0, "trainer"),
     (LossAgg.token_mean, 1, 1.05, "trainer")],
)
def test_step_matches_torch_learner(model_dir, agg, micro, seq_mask_cap, old):
    batch = make_batch()
    algo = algo_cfg(lr=1e-2, loss_agg=agg, micro_batch_tokens=tokens_for(batch, micro), seq_mask_cap=seq_mask_cap,
                    grad_clip=0.5, old_logprobs=old)
    ref = TorchLearner(model_dir, algo, MonitorConfig())
    ref_grads = {}
    step = ref.optimizer.step

    def capture(*args, **kwargs):  # the gradient TorchLearner steps with (divided, before clipping's effect)
        ref_grads.update({n: p.grad.clone() for n, p in ref.model.named_parameters() if p.grad is not None})
        return step(*args, **kwargs)

    ref.optimizer.step = capture
    ds = ds_learner(model_dir, algo)
    want, got = ref.train_step(batch).record(), ds.train_step(batch).record()
    assert set(got) == set(want)
    for key in ("loss", "pg_loss", "grad_norm", "entropy", "clip_frac", "tis_frac", "seq_masked_frac",
                "ratio_mean", "ratio_max", "mismatch/k3_kl"):
        assert got[key] == pytest.approx(want[key], rel=1e-4, abs=1e-6), key
    assert got["version"] == want["version"] == 1 and got["skipped"] is False
    # Gradients, not parameters: Adam's first step is about lr * sign(g), so near-zero entries could flip.
    # TorchLearner clips in place before stepping; the stand-in records before clipping, so clip here too.
    clip = min(1.0, 0.5 / (got["grad_norm"] + 1e-6))
    assert set(ref_grads) == set(ds.engine.grads)
    for k, g in ref_grads.items():
        assert torch.allclose(ds.engine.grads[k] * clip, g, rtol=1e-4, atol=1e-8), k
    n_micro = assign(row_tokens(batch.attention_mask, batch.response_mask, 4), 1, algo.micro_batch_tokens).micro_batches
    assert n_micro == 1 if micro == 0 else n_micro > 1
    assert ds.engine.backwards == [False] * (n_micro - 1) + [True]  # one boundary, at the last micro-batch
    if old == "trainer":  # pi_old is the trainer's own, recomputed before the update: the ratio is 1
        assert got["ratio_mean"] == pytest.approx(1.0, abs=1e-5) and got["clip_frac"] == 0.0


def test_nan_advantage_skips_without_touching_parameters(model_dir):
    algo = algo_cfg(micro_batch_tokens=tokens_for(make_batch(), 2))
    ds = ds_learner(model_dir, algo)
    before = params(ds.module)
    out = ds.train_step(make_batch(advantages=[1.0, math.nan, -1.0, 0.0])).record()
    assert out["skipped"] is True and out["skip_reason"].startswith("non-finite loss")
    assert out["version"] == 0 == ds.get_version()
    assert all(torch.equal(before[k], v) for k, v in params(ds.module).items())
    assert len(ds.engine.optimizer.state) == 0  # the optimizer never stepped
    assert ds.health()["consecutive_skips"] == 1
    out = ds.train_step(make_batch()).record()
    assert out["skipped"] is False and out["version"] == 1 and ds.health()["consecutive_skips"] == 0


def test_nan_gradient_skips_the_step(model_dir):
    ds = ds_learner(model_dir, algo_cfg())
    hook = ds.module.model.layers[0].mlp.up_proj.weight.register_hook(lambda g: torch.full_like(g, math.nan))
    before = params(ds.module)
    out = ds.train_step(make_batch()).record()
    hook.remove()
    assert out["skipped"] is True and out["skip_reason"].startswith("non-finite gradient norm")
    assert all(torch.equal(before[k], v) for k, v in params(ds.module).items())


def test_non_finite_parameters_block_export(model_dir):
    ds = ds_learner(model_dir, algo_cfg(lr=math.inf))  # finite loss and gradients, non-finite update
    out = ds.train_step(make_batch()).record()
    assert out["skipped"] is True and "not rolled back" in out["skip_reason"]
    assert out["version"] == 0 and ds.sync_blocked
    with pytest.raises(NonFiniteWeightsError, match="refusing"):
        ds.get_weights()
    with pytest.raises(SyncError, match="cannot be exported"):
        ds._check_send(0)


# -- ZeRO-3 export: bucketed gather, exact round trip ---------------------------------------------------------
class GatherLog:
    def __init__(self):
        self.open, self.buckets = 0, []

    def ctx(self, params, modifier_rank=None):
        log = self

        class Gathered:
            def __enter__(self):
                assert log.open == 0, "gathers must not nest"
                log.open += 1
                log.buckets.append(sum(p.numel() * p.element_size() for p in params))

            def __exit__(self, *exc):
                log.open -= 1

        return Gathered()


@pytest.mark.parametrize("bucket_bytes", [1, 4096, 1 << 30])
def test_zero3_export_round_trips_in_bounded_buckets(model_dir, monkeypatch, bucket_bytes):
    log = GatherLog()
    fake = types.ModuleType("deepspeed")
    fake.zero = types.SimpleNamespace(GatheredParameters=log.ctx)
    monkeypatch.setitem(sys.modules, "deepspeed", fake)
    ds = ds_learner(model_dir, algo_cfg())
    ds.zero_stage, ds.sync_bucket_bytes = 3, bucket_bytes
    want = dict(ds.module.named_parameters())
    got = list(ds.iter_weights("bfloat16"))
    assert [n for n, _ in got] == list(want)  # every parameter once, in order
    for name, t in got:
        assert t.dtype == torch.bfloat16 and t.shape == want[name].shape
        assert torch.equal(t, want[name].detach().to(torch.bfloat16))
        assert t.data_ptr() != want[name].data_ptr()  # a copy: the gathered bucket may be released
    largest = max(p.numel() * 4 for p in want.values())
    assert log.open == 0 and all(b <= max(bucket_bytes, largest) for b in log.buckets)
    assert len(log.buckets) == (len(want) if bucket_bytes == 1 else len(log.buckets))
    full = ds.get_weights()  # fp32 module here: no cast asked, so an exact copy
    assert all(torch.equal(full[k], v.detach()) for k, v in want.items())


def test_weight_meta_uses_the_full_shape_of_partitioned_parameters(model_dir):
    ds = ds_learner(model_dir, algo_cfg())
    p = ds.module.model.embed_tokens.weight
    p.ds_shape = p.shape  # what ZeRO-3 leaves behind when it empties p.data
    p.data = torch.empty(0)
    meta = ds.weight_meta("bfloat16")
    i = meta["names"].index("model.embed_tokens.weight")
    assert meta["shapes"][i] == [32, 32] and meta["dtype_names"][i] == "bfloat16"
    assert meta["max_tensor_bytes"] == 32 * 64 * 2  # the MLP's [64, 32] weights are the largest


# -- the real DeepSpeed engine, on CPU (gloo), when deepspeed is installed -------------------------------------
REAL_ENGINE = textwrap.dedent("""
    import json, math, os, socket, sys
    import torch
    sys.path[:0] = [sys.argv[2], os.path.dirname(sys.argv[2])]  # tests/unit, and tests/ for helpers
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0)); port = s.getsockname()[1]
    os.environ.update(RANK="0", LOCAL_RANK="0", WORLD_SIZE="1", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    import deepspeed
    from rlgen.config import AlgoConfig, MonitorConfig
    from rlgen.learners.deepspeed import DeepSpeedLearner, build_ds_config
    from helpers import algo_cfg, tiny_qwen2, tokens_for
    from rlgen.learners.attention import use_packed_attention
    from test_deepspeed_learner import make_batch
    stage = int(sys.argv[1])
    deepspeed.init_distributed(dist_backend="gloo")

    def learner_of(tokens):
        module = tiny_qwen2().to(torch.bfloat16)
        use_packed_attention(module, "sdpa_segments")
        algo = algo_cfg(micro_batch_tokens=tokens, lr=1e-2)
        opt = torch.optim.AdamW(module.parameters(), lr=algo.lr)
        engine, *_ = deepspeed.initialize(model=module, optimizer=opt, config=build_ds_config(algo, zero_stage=stage))
        learner = DeepSpeedLearner.__new__(DeepSpeedLearner)
        learner._init_state(algo, MonitorConfig(), 0, "learner0", torch.device("cpu"), stage, 4096)
        learner.engine = learner.model = engine
        learner.module = engine.module
        return learner

    whole = learner_of(0).train_step(make_batch()).record()  # one micro-batch, against two below: the same gradient
    learner = learner_of(tokens_for(make_batch(), 2))
    w0 = learner.get_weights()
    ok = learner.train_step(make_batch()).record()
    w1 = learner.get_weights()
    bad = learner.train_step(make_batch(advantages=[1.0, math.nan, -1.0, 0.0])).record()
    w2 = learner.get_weights()
    print(json.dumps({
        "ok": [ok["skipped"], ok["version"], math.isfinite(ok["grad_norm"])],
        "grad_norms": [whole["grad_norm"], ok["grad_norm"]],
        "bad": [bad["skipped"], bad["version"], bad.get("skip_reason", "")],
        "changed": sum(not torch.equal(w0[k], w1[k]) for k in w0), "n": len(w0),
        "changed_after_skip": sum(not torch.equal(w1[k], w2[k]) for k in w1),
        "shapes": sorted({tuple(v.shape) for v in w1.values()}),
    }))
""")


@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="needs deepspeed (pip install 'rlgen[gpu]')")
@pytest.mark.parametrize("stage", [2, 3])
def test_real_deepspeed_engine_on_cpu_steps_skips_and_exports(stage):
    here = str(Path(__file__).parent)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", "DS_ACCELERATOR": "cpu"}  # on CPU, also on a GPU host
    run = subprocess.run([sys.executable, "-c", REAL_ENGINE, str(stage), here], capture_output=True, text=True,
                         timeout=600, env=env)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["ok"] == [False, 1, True]
    whole, split = out["grad_norms"]  # two micro-batches accumulate the one-micro-batch gradient (bf16)
    assert split == pytest.approx(whole, rel=2e-2) and whole > 0
    assert out["bad"][:2] == [True, 1] and out["bad"][2].startswith("non-finite loss")
    assert out["changed"] == out["n"] and out["changed_after_skip"] == 0
    assert [32, 32] in out["shapes"] and [64, 32] in out["shapes"]  # full shapes, gathered under ZeRO-3


# -- a learner group of two ranks --------------------------------------------------------------------------
@pytest.mark.parametrize("agg,old", [(LossAgg.token_mean, "engine"), (LossAgg.seq_mean_token_mean, "engine"),
                                     (LossAgg.token_mean, "trainer")])
def test_two_ranks_on_shards_make_the_whole_batch_step(model_dir, agg, old):
    """Rank r trains on its shard with the whole batch's denominator and scales by world_size, so DeepSpeed's
    average of the two ranks' gradients is the one-rank gradient, and the merged metrics are the one-rank
    metrics."""
    from rlgen.learners.group import merge_results
    from rlgen.learners.grpo_step import batch_denominator

    batch = make_batch()
    algo = algo_cfg(lr=1e-2, loss_agg=agg, micro_batch_tokens=tokens_for(batch, 1), grad_clip=0.0, old_logprobs=old)
    whole = ds_learner(model_dir, algo)
    want = whole.train_step(batch).record()

    shards = [batch.select(torch.arange(r.start, r.stop)) for r in (range(0, 2), range(2, 4))]
    ranks = [ds_learner(model_dir, algo) for _ in shards]
    total = sum(batch_denominator(r.model, r.core.batch(b), algo, r.core.loss_agg)
                for r, b in zip(ranks, shards))
    for rank in ranks:
        rank.world_size = 2
        calls = []

        def all_reduce(value, calls=calls):  # the denominator first, then the finite-weights flag
            calls.append(value)
            return total if len(calls) == 1 else 0.0

        rank._sum_over_ranks = all_reduce
    got = merge_results([r.train_step(b) for r, b in zip(ranks, shards)]).record()

    for key in ("loss", "pg_loss", "entropy", "clip_frac", "tis_frac", "ratio_mean", "ratio_max", "seq_masked_frac",
                "response_tokens", "sequences", "mismatch/k3_kl", "mismatch/mean_abs_delta", "mismatch/max_abs_delta",
                "mismatch/tokens"):
        assert got[key] == pytest.approx(want[key], rel=1e-5, abs=1e-7), key
    assert got["skipped"] is False and got["version"] == 1
    for name, g in whole.engine.grads.items():
        averaged = (ranks[0].engine.grads[name] + ranks[1].engine.grads[name]) / 2  # DeepSpeed's data-parallel mean
        assert torch.allclose(averaged, g, rtol=1e-4, atol=1e-8), name


def test_merging_takes_the_worst_outcome_and_keeps_nan():
    from rlgen.learners.group import merge_results
    from rlgen.learners.grpo_step import STEP_REDUCTIONS
    from rlgen.metrics.reduce import MAX
    from rlgen.types import StepResult

    how = {**STEP_REDUCTIONS, "ratio_max": MAX}  # as the ranks' step results declare them
    a = StepResult(2, None, (("train", 0.0, 1.0),), {"loss": 0.5, "ratio_max": 1.1, "response_tokens": 3,
                                                     "entropy": 1.0}, rng_digest="aa", reductions=how)
    b = StepResult(2, "non-finite loss (nan) at step 4", (("train", 0.0, 2.0),),
                   {"loss": 0.25, "ratio_max": math.nan, "response_tokens": 1, "entropy": 3.0}, rng_digest="bb",
                   reductions=how)
    merged = merge_results([a, b])
    m = merged.metrics
    assert m["loss"] == 0.75 and m["response_tokens"] == 4 and m["entropy"] == pytest.approx(1.5)
    assert math.isnan(m["ratio_max"]) and merged.skipped and merged.skip_reason.startswith("non-finite")
    assert merged.version == 2 and merged.spans == () and merged.rng_digest is None  # each rank's own
    assert merged.record()["skipped"] is True and merged.record()["skip_reason"] == b.skip_reason


# -- checkpoint and resume ---------------------------------------------------------------------------------
class TorchFiles:
    """DeepSpeed's TorchCheckpointEngine, as far as saving and loading go."""

    def save(self, state_dict, path):
        torch.save(state_dict, path)


class CheckpointingStandIn(ZeroStandIn):
    """ZeroStandIn plus DeepSpeed 0.19.8's checkpoint behaviour that matters here: save_checkpoint writes its own
    keys (skipped_steps and global_steps among them) and then the client state over them, through its checkpoint
    engine (the learner's wrapper of it); load_checkpoint hands back only the keys that are not DeepSpeed's own."""

    def __init__(self, module, lr, grad_clip, files):
        super().__init__(module, lr, grad_clip)
        self.files = files

    OWN_KEYS = ("module", "sparse_tensor_module_names", "skipped_steps", "global_steps", "dp_world_size",
                "mp_world_size", "data_sampler", "random_ltd")

    def save_checkpoint(self, save_dir, tag, client_state, save_latest):
        state = {"module": self.module.state_dict(), "optimizer": self.optimizer.state_dict(), "skipped_steps": 0,
                 "global_steps": 0, "dp_world_size": 1, "mp_world_size": 1}
        state.update(client_state)
        Path(save_dir, tag).mkdir(parents=True, exist_ok=True)
        self.files.save(state, str(Path(save_dir, tag, "state.pt")))

    def load_checkpoint(self, load_dir, tag, load_optimizer_states, load_lr_scheduler_states):
        state = torch.load(Path(load_dir, tag, "state.pt"), weights_only=False)
        self.module.load_state_dict(state["module"])
        self.optimizer.load_state_dict(state["optimizer"])
        return load_dir, {k: v for k, v in state.items() if k not in self.OWN_KEYS and k not in ("optimizer",)}


def _checkpointing(learner, algo) -> None:
    learner._ckpt_files.inner = TorchFiles()
    learner.engine = learner.model = CheckpointingStandIn(learner.module, algo.lr, algo.grad_clip, learner._ckpt_files)


@pytest.mark.parametrize("background", [False, True], ids=["at-once", "in-the-background"])
def test_checkpoint_resume_restores_counters_and_weights(model_dir, tmp_path, background):
    """The learner's counters survive DeepSpeed's client-state filter (a 'skipped_steps' of rlgen's own at the top
    level would be dropped on load), and the resumed learner holds the saved weights. In the background, the
    files DeepSpeed hands its checkpoint engine are host copies, written after a train step changed the weights."""
    algo = algo_cfg(lr=1e-2, micro_batch_tokens=tokens_for(make_batch(), 2), grad_clip=1.0)
    first = ds_learner(model_dir, algo)
    _checkpointing(first, algo)
    first.train_step(make_batch())
    first.skipped_steps, first.consecutive_skips, first.last_skip_reason = 3, 1, "non-finite grad norm"
    saved = params(first.module)
    out = first.save_checkpoint(str(tmp_path), background)
    assert out["background"] is background
    if background:
        first.train_step(make_batch())  # training goes on while the copies are written
        assert first._writer.wait(timeout=60) and (tmp_path / "learner" / "rank0.done").is_file()
        assert first.version == 2
    assert (tmp_path / "model" / "config.json").is_file()

    second = ds_learner(model_dir, algo)
    _checkpointing(second, algo)
    assert any(not torch.equal(saved[k], v) for k, v in params(second.module).items())
    second._resume(str(tmp_path))
    assert (second.version, second.calls) == (1, 1)
    assert (second.skipped_steps, second.consecutive_skips, second.last_skip_reason) == (3, 1, "non-finite grad norm")
    assert all(torch.equal(saved[k], v) for k, v in params(second.module).items())
