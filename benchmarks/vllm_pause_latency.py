"""How long vLLM alone (AsyncLLM, no rlgen) takes to pause an engine that is generating: the floor under an
in-flight weight update's pause (docs/benchmarks.md, "An NCCL update in flight: where a TP-2 engine's pause goes").

    python benchmarks/vllm_pause_latency.py MODEL_DIR OUT.json [--tp 2] [--rounds 6]

Two situations, one after the other on the same engine:
  steady      64 prompts x 8 samples of 1024 tokens generating; pause(keep) and resume, `rounds` times
  new batch   the same, with another 64 x 8 added at the moment of each pause: sent after the pause
              (add_after) or before it (add_first)
Each line of OUT.json's "calls" is one pause: its situation, and the seconds of is_paused (a no-op call to the
engine core), pause_generation and resume_generation.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time


async def measure(model: str, tp: int, rounds: int) -> list[dict]:
    from vllm import SamplingParams
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.engine.async_llm import AsyncLLM

    llm = AsyncLLM.from_engine_args(AsyncEngineArgs(model=model, tensor_parallel_size=tp, gpu_memory_utilization=0.7,
                                                    max_num_seqs=1024, max_model_len=2048))
    params = SamplingParams(n=8, max_tokens=1024, temperature=1.0, detokenize=False, ignore_eos=True, logprobs=0,
                            output_kind=RequestOutputKind.FINAL_ONLY)

    async def request(tag: str, i: int) -> None:
        async for _ in llm.generate({"prompt_token_ids": [1, 2, 3, 4, 5, 6, 7, 8 + i]}, params, f"{tag}-{i}"):
            pass

    batches = [asyncio.gather(*(request("first", i) for i in range(64)))]
    calls: list[dict] = []
    try:
        await asyncio.sleep(3)
        for k in range(rounds):
            for situation in ("steady", "add_after", "add_first"):
                if situation != "steady":
                    batches.append(asyncio.gather(*(request(f"{situation}{k}", i) for i in range(64))))
                if situation == "add_first":
                    await asyncio.sleep(0)  # the new requests go to the engine before the pause does
                t0 = time.time()
                await llm.is_paused()
                t1 = time.time()
                await llm.pause_generation(mode="keep", clear_cache=False)
                t2 = time.time()
                await llm.resume_generation()
                t3 = time.time()
                calls.append({"round": k, "situation": situation, "core_noop_s": t1 - t0, "pause_s": t2 - t1,
                              "resume_s": t3 - t2})
                print(calls[-1], flush=True)
                await asyncio.sleep(1.5)
    finally:
        for b in batches:
            b.cancel()
        llm.shutdown()
    return calls


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("out")
    ap.add_argument("--tp", type=int, default=1)
    ap.add_argument("--rounds", type=int, default=6)
    args = ap.parse_args()
    calls = asyncio.run(measure(args.model, args.tp, args.rounds))
    with open(args.out, "w") as f:
        json.dump({"model": args.model, "tp": args.tp, "calls": calls}, f, indent=1)


if __name__ == "__main__":
    main()
