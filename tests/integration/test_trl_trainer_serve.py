"""TRL's GRPOTrainer in server mode (``use_vllm=True, vllm_mode="server"``), unchanged, generating through
`rlgen serve` on CPU: two optimizer steps of the tiny model, each group of completions made by the server's hf
engines and scored by TRL. TRL joins a server's workers over NCCL for weight updates, which needs CUDA; this test
runs generation only (TRL's vLLM check, NCCL join and weight push replaced by no-ops; its prefix-cache reset kept),
as TRL's recipe does on one GPU. TRL reads the server's logprobs mode from /server_info and warns when it would
bias its importance-sampling correction; the test asserts it does not."""

from __future__ import annotations

import logging

import pytest

from helpers import serve_in_thread, tiny_pool
from rlgen.serve.app import make_app

pytest.importorskip("trl")
datasets = pytest.importorskip("datasets")


def test_grpo_trainer_generates_through_rlgen_serve(tmp_path, monkeypatch, caplog):
    import trl.generation.vllm_client as client_mod
    import trl.generation.vllm_generation as generation_mod
    from trl import GRPOConfig, GRPOTrainer

    monkeypatch.setattr(client_mod, "is_vllm_available", lambda *a, **k: True)
    monkeypatch.setattr(generation_mod, "is_vllm_available", lambda *a, **k: True)
    monkeypatch.setattr(client_mod.VLLMClient, "init_communicator", lambda self, device=0: None)
    monkeypatch.setattr(generation_mod.VLLMGeneration, "sync_weights",
                        lambda self: self.vllm_client.reset_prefix_cache())

    pool = tiny_pool(2)
    seen: list[str] = []

    def reward(completions, **_):
        seen.extend(completions)
        return [float(len(c) % 3) for c in completions]

    prompts = datasets.Dataset.from_list([{"prompt": f"{a}+{a + 1}="} for a in range(8)])
    args = GRPOConfig(output_dir=str(tmp_path), use_vllm=True, vllm_mode="server", use_cpu=True, bf16=False,
                      max_steps=2, per_device_train_batch_size=4, num_generations=4, max_completion_length=6,
                      learning_rate=1e-4, logging_steps=1, save_strategy="no", report_to=[], seed=0,
                      vllm_server_timeout=30)
    with serve_in_thread(make_app(pool, token=None, max_sequences=4096, max_body_mb=8.0)) as url:
        args.vllm_server_base_url = url
        trainer = GRPOTrainer(model=pool.model.path, reward_funcs=reward, args=args, train_dataset=prompts,
                              processing_class=pool.model.tokenizer)
        with caplog.at_level(logging.WARNING):
            result = trainer.train()
    assert result.global_step == 2
    assert pool.requests >= 2 and pool.sequences >= 8  # TRL's batches came from the server's engines
    assert len(seen) >= 8 and all(isinstance(c, str) for c in seen)
    assert not [r for r in caplog.records if "logprobs-mode" in r.getMessage()]
    logged = [h for h in trainer.state.log_history if "reward" in h]
    assert logged and all(h["completions/mean_length"] > 0 for h in logged)
