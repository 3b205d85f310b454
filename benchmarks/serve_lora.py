"""Named LoRA adapters on a running `rlgen serve`: the time to load and unload one (/v1/load_lora_adapter and
/v1/unload_lora_adapter), and generation with it against generation on the base, side by side on the same server.

    rlgen serve engine=vllm hardware=1xh100 model=qwen2_5_1_5b engine.max_lora_rank=16 serve.port=8011 &
    python benchmarks/serve_lora.py http://127.0.0.1:8011 /path/to/adapter_folder [OUT.json]

The adapter folder is read on the server's machine (a LoRA run's final_model/, say). The script waits up to 15
minutes for the server to answer, then loads the adapter as "bench", generates the same seeded batch of 64
prompts of 32 tokens x 4 samples of 128 tokens (less where max_model_len is shorter) with and without it (twice each; the second of each counts), completes
one text through /v1/completions with model="bench", unloads it, and checks that a request naming it is then
refused. It prints one JSON object (and writes it to OUT.json when given).
"""

from __future__ import annotations

import json
import sys
import time

from rlgen.wire.client import GenerationClient, ServerError

PROMPT_TOKENS, NEW_TOKENS = 32, 128


def _batch(info: dict) -> tuple[list[list[int]], dict]:
    """64 prompts of 32 token ids inside the model's vocabulary, 4 samples each of up to 128 new tokens (fewer
    when the server's max_model_len is shorter)."""
    vocab, room = int(info["vocab_size"]), int(info["max_model_len"])
    prompt = min(PROMPT_TOKENS, room // 4)
    prompts = [[3 + (7 * i + 13 * j) % (vocab - 3) for j in range(prompt)] for i in range(64)]
    return prompts, {"n": 4, "max_tokens": min(NEW_TOKENS, room - prompt), "temperature": 1.0, "seed": 0,
                     "ignore_eos": True}


def _wait(client: GenerationClient, limit_s: float = 900.0) -> None:
    deadline = time.time() + limit_s
    while time.time() < deadline:
        try:
            if client.health().get("ok"):
                return
        except ServerError:
            pass
        time.sleep(2)
    raise SystemExit(f"no healthy server within {limit_s:.0f} s")


def _generate(client: GenerationClient, adapter: str | None, prompts: list[list[int]], sampling: dict) -> dict:
    best = {}
    for _ in range(2):
        t0 = time.time()
        out = client.generate_ids(prompts, adapter=adapter, **sampling)
        seconds = time.time() - t0
        tokens = sum(len(c.token_ids) for c in out.completions)
        best = {"seconds": round(seconds, 3), "tokens": tokens, "tokens_per_s": round(tokens / seconds, 1)}
    return best


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__)
        return 2
    url, folder = argv[0], argv[1]
    result: dict = {"url": url, "adapter": folder}
    with GenerationClient(url, timeout_s=600) as client:
        _wait(client)
        info = client.info()
        prompts, sampling = _batch(info)
        result["info_before"] = {k: info[k] for k in ("model", "engine_kind", "max_lora_rank", "adapters", "dtype")}
        result["base"] = _generate(client, None, prompts, sampling)
        t0 = time.time()
        client.load_lora_adapter("bench", folder)
        result["load_s"] = round(time.time() - t0, 3)
        result["with_adapter"] = _generate(client, "bench", prompts, sampling)
        result["completion"] = client.complete("1+1=", model="bench", max_tokens=8, temperature=0.0)["model"]
        t0 = time.time()
        client.unload_lora_adapter("bench")
        result["unload_s"] = round(time.time() - t0, 3)
        try:
            client.generate_ids(prompts[:1], adapter="bench", max_tokens=4)
            result["refused_after_unload"] = False
        except ServerError as err:
            result["refused_after_unload"] = err.status == 404
        result["adapter_over_base_tokens_per_s"] = round(
            result["with_adapter"]["tokens_per_s"] / result["base"]["tokens_per_s"], 3)
    print(json.dumps(result, indent=1))
    if len(argv) > 2:
        with open(argv[2], "w") as f:
            json.dump(result, f, indent=1)
    ok = result["refused_after_unload"] and result["completion"] == "bench"
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
