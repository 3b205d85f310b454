"""rlgen at 64 and 512 GPUs, on paper: the planner's roofline for each layout, the weight-sync fan-out, and the
driver's own per-step work measured here (decoding completions, scoring them, building the padded batch,
putting it in Ray's object store), scaled to the layout's batch.

    python benchmarks/scale_on_paper.py OUT.json

Prints a table and writes OUT.json. CPU only: the GPU numbers are the planner's model (src/rlgen/plan/prediction.py,
calibrated on H100/H200 runs); the driver numbers are measured on this machine with rlgen's own functions.
"""

from __future__ import annotations

import json
import sys
import time

from rlgen.config.compose import compose_run_config
from rlgen.plan import build_plan
from rlgen.plan.prediction import predict

# vLLM's packed NCCL update, as measured end to end (docs/benchmarks.md, 1.5B on 2xH200): 29 GB/s, bound by
# load_weights and RPCs in each engine rather than by the wire (raw NCCL there: 267 GB/s). Every engine loads in
# parallel, so it does not grow with the number of engines.
UPDATE_GBPS = 29.0
# Across nodes a pipelined NCCL broadcast (ring or tree) moves at about one link's bandwidth whatever the
# fan-out: 400 Gb/s InfiniBand per GPU is 50 GB/s, of which ~40 usable.
NETWORK_GBPS = 40.0

LAYOUTS = {
    # 8 nodes of 8 H100: engines on 4 nodes (32 TP-1 engines), 32 DeepSpeed ranks on the other 4.
    "64 GPUs": ["engine=vllm", "hardware=2x8xh100", "hardware.nodes=8", "hardware.engine_gpus=32",
                "hardware.learner_gpus=32", "model=qwen2_5_7b", "algo.prompts_per_step=256",
                "algo.samples_per_prompt=16", "task.max_prompt_tokens=512", "algo.max_new_tokens=2048",
                "engine.max_model_len=4096", "algo.micro_batch_tokens=2560", "algo.async_steps=1", "learner.zero_stage=3"],
    # 64 nodes: 256 engines and 256 ranks, eight times the batch.
    "512 GPUs": ["engine=vllm", "hardware=2x8xh100", "hardware.nodes=64", "hardware.engine_gpus=256",
                 "hardware.learner_gpus=256", "model=qwen2_5_7b", "algo.prompts_per_step=2048",
                 "algo.samples_per_prompt=16", "task.max_prompt_tokens=512", "algo.max_new_tokens=2048",
                 "engine.max_model_len=4096", "algo.micro_batch_tokens=2560", "algo.async_steps=1",
                 "learner.zero_stage=3"],
}
MEAN_RESPONSE = 1024  # tokens: RL responses are long-tailed, about half the cap on average


def driver_costs(sequences: int = 1024, prompt: int = 512, response: int = MEAN_RESPONSE) -> dict[str, float]:
    """Seconds per sequence of the driver's step work, measured on `sequences` synthetic completions."""
    import random

    import ray

    from rlgen.algo.advantages import group_advantages
    from rlgen.models import build_tokenizer
    from rlgen.runtime.rollouts.batch import StepPrompts, build_batch
    from rlgen.tasks.base import Prompt
    from rlgen.tasks.rewards import exact_match
    from rlgen.types import Completion

    tok = build_tokenizer()
    rng = random.Random(0)
    vocab = len(tok)
    comps = [Completion(i // 16, [rng.randrange(3, vocab) for _ in range(prompt)],
                        [rng.randrange(3, vocab) for _ in range(response)], [-0.5] * response, "length", 0)
             for i in range(sequences)]
    t0 = time.perf_counter()
    texts = tok.batch_decode([c.token_ids for c in comps], skip_special_tokens=True)
    decode = time.perf_counter() - t0
    sp = StepPrompts(0, [Prompt("p", "a")] * (sequences // 16 + 1), [])
    t0 = time.perf_counter()
    rewards = [exact_match(t, sp.prompts[c.group_id].answer) for c, t in zip(comps, texts)]
    reward = time.perf_counter() - t0
    t0 = time.perf_counter()
    batch = build_batch(comps, rewards, 0)
    batch.advantages = group_advantages(batch.rewards, batch.group_ids)  # the step's advantages phase, as GRPO's
    build = time.perf_counter() - t0
    ray.init(address="local", num_cpus=1, include_dashboard=False, log_to_driver=False)
    try:
        t0 = time.perf_counter()
        ref = ray.put(batch)
        put = time.perf_counter() - t0
        nbytes = sum(t.numel() * t.element_size() for t in (batch.input_ids, batch.attention_mask,
                                                            batch.response_mask, batch.engine_logprobs))
        del ref
    finally:
        ray.shutdown()
    return {"decode_s": decode / sequences, "reward_exact_match_s": reward / sequences,
            "build_batch_s": build / sequences, "object_store_put_s": put / sequences,
            "batch_bytes": nbytes / sequences}


def main(out: str) -> int:
    per_seq = driver_costs()
    rows = {}
    for name, overrides in LAYOUTS.items():
        cfg = compose_run_config(overrides)
        plan = build_plan(cfg)
        pred = predict(plan, mean_response_tokens=MEAN_RESPONSE)
        seqs = plan.batch.sequences_per_step
        weights_gb = plan.model.params * 2 / 1e9
        driver = {k: v * seqs for k, v in per_seq.items()}
        rows[name] = {
            "engines": len(plan.engines), "learner_ranks": len(plan.learners),
            "engines_per_learner": len(plan.engines) / len(plan.learners),
            "sequences_per_step": seqs,
            "gen_s": pred.gen_s, "train_s": pred.train_s, "step_s": pred.step_s,
            "sync_update_s": weights_gb / UPDATE_GBPS, "sync_network_s": weights_gb / NETWORK_GBPS,
            "driver_decode_s": driver["decode_s"], "driver_build_batch_s": driver["build_batch_s"],
            "driver_object_store_s": driver["object_store_put_s"], "driver_reward_exact_match_s":
                driver["reward_exact_match_s"], "batch_gb": driver["batch_bytes"] / 1e9,
            "driver_total_s": driver["decode_s"] + driver["build_batch_s"] + driver["object_store_put_s"]
                              + driver["reward_exact_match_s"],
        }
    result = {"per_sequence_on_this_cpu": per_seq, "mean_response_tokens": MEAN_RESPONSE, "layouts": rows}
    with open(out, "w") as f:
        json.dump(result, f, indent=2)
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1] if len(sys.argv) > 1 else "scale_on_paper.json"))
