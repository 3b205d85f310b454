"""OpenAI-style text completions (``POST /v1/completions``) on top of token-in/token-out generation: the prompt
is tokenized on the server, completions are decoded and cut at stop strings. Streaming, echo and best_of are
not offered; a request that asks for them is refused."""

from __future__ import annotations

import time
import uuid
from typing import Any

from rlgen.types import Completion, GenRequest, SamplingParams
from rlgen.wire.protocol import BadRequest, check_length, check_sampling

FIELDS = {"model", "prompt", "max_tokens", "temperature", "top_p", "n", "stop", "seed", "logprobs", "user",
          "stream", "echo", "best_of"}


def _prompts(prompt: Any, model: Any) -> list[list[int]]:
    """A string, a list of strings, a list of token ids, or a list of such lists -> token id lists."""
    if isinstance(prompt, str):
        prompt = [prompt]
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        prompt = [prompt]
    if not isinstance(prompt, list) or not prompt:
        raise BadRequest("prompt must be a string, a list of strings, or token ids.")
    out = []
    for p in prompt:
        if isinstance(p, str):
            out.append(model.tokenizer(p, add_special_tokens=False)["input_ids"])
        elif isinstance(p, list) and all(isinstance(t, int) for t in p):
            out.append(list(p))
        else:
            raise BadRequest("prompt must be a string, a list of strings, or token ids.")
    return out


def _adapter(name: Any, model: Any, adapters: Any) -> str | None:
    """The LoRA adapter a request's ``model`` names: None for the served model itself (or no name)."""
    if name is None or name in (model.name, model.path):
        return None
    if name in adapters:
        return str(name)
    raise BadRequest(f"model={name!r} is not served here: this server serves {model.name!r}"
                     + (f" and the adapters {sorted(adapters)}" if adapters else "") + ".", status=404)


def completions_request(data: dict[str, Any], model: Any, adapters: Any = ()) -> tuple[list[GenRequest], list[str]]:
    """The requests of a /v1/completions body, and its stop strings; ``model`` may name a loaded adapter."""
    unknown = sorted(set(data) - FIELDS)
    if unknown:
        raise BadRequest(f"unknown field(s) {unknown} for /v1/completions.")
    for flag in ("stream", "echo"):
        if data.get(flag):
            raise BadRequest(f"{flag}=true is not supported by rlgen serve; leave it out.")
    if int(data.get("best_of") or 1) != 1:
        raise BadRequest("best_of is not supported by rlgen serve; use n.")
    stop = data.get("stop") or []
    stops = [stop] if isinstance(stop, str) else list(stop)
    if not all(isinstance(s, str) and s for s in stops):
        raise BadRequest("stop must be a string or a list of non-empty strings.")
    try:
        sampling = SamplingParams(n=int(data.get("n", 1)), temperature=float(data.get("temperature", 1.0)),
                                  top_p=float(data.get("top_p", 1.0)), max_new_tokens=int(data.get("max_tokens", 16)),
                                  seed=None if data.get("seed") is None else int(data["seed"]))
    except (TypeError, ValueError) as err:
        raise BadRequest(str(err)) from err
    check_sampling(sampling, "the request")
    adapter = _adapter(data.get("model"), model, adapters)
    reqs = []
    for i, ids in enumerate(_prompts(data.get("prompt"), model)):
        if not ids:
            raise BadRequest(f"prompt {i} is empty.")
        check_length(len(ids), sampling.max_new_tokens, model.max_model_len, f"prompt {i}")
        reqs.append(GenRequest(tuple(ids), sampling, i, adapter))
    return reqs, stops


def _cut(text: str, stops: list[str]) -> tuple[str, bool]:
    hits = [text.find(s) for s in stops if s in text]
    return (text[: min(hits)], True) if hits else (text, False)


def completions_response(completions: list[Completion], reqs: list[GenRequest], stops: list[str], model: Any,
                         with_logprobs: bool) -> dict[str, Any]:
    tok = model.tokenizer
    choices = []
    completion_tokens = 0
    for index, c in enumerate(completions):
        text, cut = _cut(tok.decode(c.token_ids, skip_special_tokens=True), stops)
        completion_tokens += len(c.token_ids)
        choice: dict[str, Any] = {"index": index, "text": text, "finish_reason": "stop" if cut else c.finish_reason,
                                  "logprobs": None, "policy_version": c.version}
        if with_logprobs:
            pieces = [tok.decode([t]) for t in c.token_ids]
            offsets = [sum(len(p) for p in pieces[:k]) for k in range(len(pieces))]
            choice["logprobs"] = {"tokens": pieces, "token_logprobs": list(c.logprobs), "top_logprobs": None,
                                  "text_offset": offsets}
        choices.append(choice)
    prompt_tokens = sum(len(r.prompt_ids) for r in reqs)
    return {"id": f"cmpl-{uuid.uuid4().hex}", "object": "text_completion", "created": int(time.time()),
            "model": (reqs[0].adapter if reqs else None) or model.name, "choices": choices,
            "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                      "total_tokens": prompt_tokens + completion_tokens}}
