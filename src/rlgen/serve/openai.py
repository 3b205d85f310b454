"""OpenAI-style routes on top of token-in/token-out generation: text completions (``POST /v1/completions``), chat
completions (``POST /v1/chat/completions``, the prompt rendered with the model folder's chat template) and the
model list (``GET /v1/models``: the served model and its loaded LoRA adapters; ``GET /v1/models/{id}``: one of
them). Prompts are tokenized on the server; completions are decoded and cut at stop strings, and the tokens,
logprobs and usage count only what is returned. Every choice keeps the ``policy_version`` of the weights that made
it. The sampling fields vLLM's server takes (top_k, min_p, repetition_penalty, frequency_penalty,
presence_penalty, logit_bias) reach the engines, and logprobs come with their top alternatives; vLLM's
``prompt_logprobs`` scores the prompt (TRL's get_sequence_logprobs). ``stream=true`` answers in server-sent
events (rlgen.serve.stream). ``echo`` puts the prompt's text before each completion's (without logprobs). best_of
and tools are not offered; a request that asks for them is refused in one sentence."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass
from typing import Any

from rlgen.types import Completion, GenRequest, SamplingParams
from rlgen.wire.protocol import BadRequest, check_length, check_sampling, logit_bias, sampling_extras

COMMON = {"model", "max_tokens", "temperature", "top_p", "n", "stop", "seed", "logprobs", "user", "stream",
          "stream_options", "top_k", "min_p", "repetition_penalty", "frequency_penalty", "presence_penalty", "logit_bias",
          # vLLM's own: token ids in the answer (TRL's client asks for both)
          "return_token_ids", "return_tokens_as_token_ids"}
FIELDS = COMMON | {"prompt", "echo", "best_of", "prompt_logprobs"}
CHAT_FIELDS = COMMON | {"messages", "max_completion_tokens", "top_logprobs", "chat_template", "chat_template_kwargs",
                        "tools", "tool_choice"}
ROLES = {"system", "developer", "user", "assistant", "tool"}


# -- requests ----------------------------------------------------------------------------------------------
def _adapter(name: Any, model: Any, adapters: Any) -> str | None:
    """The LoRA adapter a request's ``model`` names: None for the served model itself (or no name)."""
    if name is None or name in (model.name, model.path):
        return None
    if name in adapters:
        return str(name)
    raise BadRequest(f"model={name!r} is not served here: this server serves {model.name!r}"
                     + (f" and the adapters {sorted(adapters)}" if adapters else "") + " (GET /v1/models lists them).",
                     status=404)


def _token_ids(ids: list[int], model: Any, where: str) -> list[int]:
    bad = [t for t in ids if not 0 <= t < model.vocab_size]
    if bad:
        raise BadRequest(f"{where}: token id {bad[0]} is outside the model's vocabulary of {model.vocab_size}.")
    return ids


def _prompts(prompt: Any, model: Any) -> list[list[int]]:
    """A string, a list of strings, a list of token ids, or a list of such lists -> token id lists."""
    if isinstance(prompt, str):
        prompt = [prompt]
    if isinstance(prompt, list) and prompt and all(isinstance(t, int) for t in prompt):
        prompt = [prompt]
    if not isinstance(prompt, list) or not prompt:
        raise BadRequest("prompt must be a string, a list of strings, or token ids.")
    out = []
    for i, p in enumerate(prompt):
        if isinstance(p, str):
            out.append(model.tokenizer(p, add_special_tokens=False)["input_ids"])
        elif isinstance(p, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in p):
            out.append(_token_ids(list(p), model, f"prompt {i}"))
        else:
            raise BadRequest("prompt must be a string, a list of strings, or token ids.")
    return out


def _refuse(data: dict[str, Any], known: set[str], route: str) -> None:
    unknown = sorted(set(data) - known)
    if unknown:
        raise BadRequest(f"unknown field(s) {unknown} for {route}.")
    if data.get("echo") and data.get("logprobs") is not None:
        raise BadRequest("echo with logprobs would need the prompt's logprobs among the choice's, which rlgen serve "
                         "does not give; ask for one of them, or for prompt_logprobs, which scores the prompt.")
    if data.get("tools"):
        raise BadRequest("tools are not supported by rlgen serve's chat route; render them into the messages.")
    if data.get("stream_options") is not None and not isinstance(data["stream_options"], dict):
        raise BadRequest("stream_options must be an object such as {\"include_usage\": true}.")
    if int(data.get("best_of") or 1) != 1:
        raise BadRequest("best_of is not supported by rlgen serve; use n.")
    if data.get("prompt_logprobs") is not None and data.get("stream"):
        raise BadRequest("prompt_logprobs is not offered with stream=true; ask for it without streaming.")


def _prompt_logprobs(data: dict[str, Any], model: Any) -> int | None:
    """vLLM's prompt_logprobs: how many of the most likely tokens to report at each prompt position, beside the
    prompt's own (-1: all of them), within what the engines give."""
    value = data.get("prompt_logprobs")
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < -1:
        raise BadRequest(f"prompt_logprobs={value!r} must be a whole number: the most likely tokens to report at each "
                         "prompt position (0: the prompt's own alone; -1: every token).")
    limit = model.max_logprobs
    if limit is not None and limit >= 0 and not 0 <= value <= limit:
        raise BadRequest(f"prompt_logprobs={value} is more than this server's engines give (vLLM's max_logprobs="
                         f"{limit}); ask for 0 to {limit}.")
    return value


def _max_tokens(data: dict[str, Any], keys: tuple[str, ...], default: int) -> int:
    """The first of ``keys`` the request sets (0 is set, and refused, as OpenAI's API refuses it), else default."""
    key = next((k for k in keys if data.get(k) is not None), None)
    if key is None:
        return default
    try:
        value = int(data[key])
    except (TypeError, ValueError) as err:
        raise BadRequest(f"{key}={data[key]!r} must be a whole number of tokens.") from err
    if value < 1:
        raise BadRequest(f"{key}={value} must be at least 1.")
    return value


def _sampling(data: dict[str, Any], max_tokens: Any, top: Any, model: Any) -> tuple[SamplingParams, list[str]]:
    """The request's sampling settings; ``top``: how many alternatives to report per token."""
    stop = data.get("stop") or []
    stops = [stop] if isinstance(stop, str) else list(stop)
    if not all(isinstance(s, str) and s for s in stops):
        raise BadRequest("stop must be a string or a list of non-empty strings.")
    try:
        extras = {k: v for k, v in sampling_extras(data).items() if k != "logprobs"}
        sampling = SamplingParams(n=1 if data.get("n") is None else int(data["n"]),  # n=0 is refused, not 1
                                  temperature=float(data.get("temperature", 1.0)),
                                  top_p=float(data.get("top_p", 1.0)), max_new_tokens=int(max_tokens),
                                  seed=None if data.get("seed") is None else int(data["seed"]), logprobs=int(top or 0),
                                  prompt_logprobs=_prompt_logprobs(data, model),
                                  logit_bias=logit_bias(data.get("logit_bias"), model.vocab_size, "the request"),
                                  **extras)
    except (TypeError, ValueError) as err:
        raise BadRequest(str(err)) from err
    check_sampling(sampling, "the request")
    return sampling, stops


def _requests(prompts: list[list[int]], sampling: SamplingParams, model: Any, adapter: str | None) -> list[GenRequest]:
    reqs = []
    for i, ids in enumerate(prompts):
        if not ids:
            raise BadRequest(f"prompt {i} is empty.")
        check_length(len(ids), sampling.max_new_tokens, model.max_model_len, f"prompt {i}")
        reqs.append(GenRequest(tuple(ids), sampling, i, adapter))
    return reqs


def completions_request(data: dict[str, Any], model: Any, adapters: Any = ()) -> tuple[list[GenRequest], list[str]]:
    """The requests of a /v1/completions body, and its stop strings; ``model`` may name a loaded adapter."""
    _refuse(data, FIELDS, "/v1/completions")
    sampling, stops = _sampling(data, _max_tokens(data, ("max_tokens",), 16), data.get("logprobs"), model)
    adapter = _adapter(data.get("model"), model, adapters)
    return _requests(_prompts(data.get("prompt"), model), sampling, model, adapter), stops


def chat_request(data: dict[str, Any], model: Any, adapters: Any = ()) -> tuple[list[GenRequest], list[str]]:
    """The request of a /v1/chat/completions body: its messages rendered with the model's chat template."""
    _refuse(data, CHAT_FIELDS, "/v1/chat/completions")
    if data.get("top_logprobs") and not data.get("logprobs"):
        raise BadRequest("top_logprobs needs logprobs=true.")
    messages = data.get("messages")
    if not isinstance(messages, list) or not messages or not all(
            isinstance(m, dict) and m.get("role") in ROLES and isinstance(m.get("content"), str) for m in messages):
        raise BadRequest(f"messages must be a non-empty list of {{role, content}} with a role in {sorted(ROLES)} and "
                         "text content.")
    if not getattr(model.tokenizer, "chat_template", None) and not data.get("chat_template"):
        raise BadRequest(f"model {model.name!r} has no chat template in its folder; use /v1/completions, or serve a "
                         "model folder whose tokenizer has one.")
    template, extra = data.get("chat_template"), data.get("chat_template_kwargs") or {}
    if not isinstance(extra, dict) or (template is not None and not isinstance(template, str)):
        raise BadRequest("chat_template must be a Jinja template string and chat_template_kwargs an object.")
    try:
        out = model.tokenizer.apply_chat_template([{"role": m["role"], "content": m["content"]} for m in messages],
                                                  add_generation_prompt=True, tokenize=True, chat_template=template,
                                                  **extra)
    except Exception as err:  # noqa: BLE001 - a template error (jinja's types vary) is the request's fault
        raise BadRequest(f"the chat template could not render these messages ({err}).") from err
    ids = [int(i) for i in (out["input_ids"] if hasattr(out, "keys") else out)]
    max_tokens = _max_tokens(data, ("max_completion_tokens", "max_tokens"), max(model.max_model_len - len(ids), 1))
    sampling, stops = _sampling(data, max_tokens, data.get("top_logprobs"), model)
    return _requests([ids], sampling, model, _adapter(data.get("model"), model, adapters)), stops


# -- answers -----------------------------------------------------------------------------------------------
def cut_at_stop(tok: Any, token_ids: list[int], stops: list[str]) -> tuple[int, str, bool]:
    """(how many tokens to return, their text, whether a stop string cut them): the fewest tokens whose text holds
    a stop string, the text ending before it; all of them when none does."""
    text = tok.decode(token_ids, skip_special_tokens=True)
    if not any(s in text for s in stops):
        return len(token_ids), text, False
    lo, hi = 1, len(token_ids)  # a prefix that holds a stop string goes on holding it
    while lo < hi:
        mid = (lo + hi) // 2
        if any(s in tok.decode(token_ids[:mid], skip_special_tokens=True) for s in stops):
            hi = mid
        else:
            lo = mid + 1
    text = tok.decode(token_ids[:lo], skip_special_tokens=True)
    return lo, text[: min(text.find(s) for s in stops if s in text)], True


def usage_of(reqs: list[GenRequest], completion_tokens: int) -> dict[str, int]:
    prompt_tokens = sum(len(r.prompt_ids) for r in reqs)
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def _returned(completions: list[Completion], stops: list[str], tok: Any) -> list[tuple[Completion, int, str, str]]:
    """Each completion with the tokens it returns, its text and its finish reason."""
    out = []
    for c in completions:
        n, text, cut = cut_at_stop(tok, c.token_ids, stops)
        out.append((c, n, text, "stop" if cut else c.finish_reason))
    return out


@dataclass(frozen=True)
class Shape:
    """What an answer holds: logprobs (for completions, the top alternatives count comes with the sampling), the
    token ids of prompt and choices (vLLM's return_token_ids), and tokens named by id ("token_id:<id>", vLLM's
    return_tokens_as_token_ids) rather than by their text."""

    logprobs: bool = False
    token_ids: bool = False
    as_ids: bool = False
    echo: bool = False  # a text completion's text starts with its prompt's

    @classmethod
    def of(cls, data: dict[str, Any], chat: bool) -> Shape:
        logprobs = bool(data.get("logprobs")) if chat else data.get("logprobs") is not None
        return cls(logprobs, bool(data.get("return_token_ids")), bool(data.get("return_tokens_as_token_ids")),
                   bool(data.get("echo")) and not chat)

    def name(self, tok: Any, token: int) -> str:
        return f"token_id:{token}" if self.as_ids else tok.decode([token])

    def echoed(self, tok: Any, req: GenRequest) -> str:
        """The text a choice of ``req`` starts with: its prompt's, with echo."""
        return tok.decode(list(req.prompt_ids)) if self.echo else ""


def completions_response(completions: list[Completion], reqs: list[GenRequest], stops: list[str], model: Any,
                         shape: Shape) -> dict[str, Any]:
    tok = model.tokenizer
    choices = []
    returned = _returned(completions, stops, tok)
    of = [r for r in reqs for _ in range(r.sampling.n)]  # each completion's request: n per request, in order
    for index, (c, n, text, reason) in enumerate(returned):
        choice: dict[str, Any] = {"index": index, "text": shape.echoed(tok, of[index]) + text,
                                  "finish_reason": reason, "logprobs": None, "policy_version": c.version}
        if shape.logprobs:
            choice["logprobs"] = completion_logprobs(tok, c.token_ids[:n], c.logprobs[:n], c.top_logprobs[:n], shape)
        if shape.token_ids:
            choice.update(prompt_token_ids=list(c.prompt_ids), token_ids=list(c.token_ids[:n]))
        if of[index].sampling.prompt_logprobs is not None:
            choice["prompt_logprobs"] = prompt_logprobs(tok, c.prompt_logprobs, shape)
        choices.append(choice)
    return _envelope(False, reqs, model, choices, sum(n for _, n, _, _ in returned))


def chat_response(completions: list[Completion], reqs: list[GenRequest], stops: list[str], model: Any,
                  shape: Shape) -> dict[str, Any]:
    tok = model.tokenizer
    choices = []
    returned = _returned(completions, stops, tok)
    for index, (c, n, text, reason) in enumerate(returned):
        logprobs = chat_logprobs(tok, c.token_ids[:n], c.logprobs[:n], c.top_logprobs[:n], shape) if shape.logprobs else None
        choice = {"index": index, "message": {"role": "assistant", "content": text}, "finish_reason": reason,
                  "logprobs": logprobs, "policy_version": c.version}
        if shape.token_ids:
            choice["token_ids"] = list(c.token_ids[:n])
        choices.append(choice)
    out = _envelope(True, reqs, model, choices, sum(n for _, n, _, _ in returned))
    if shape.token_ids:
        out["prompt_token_ids"] = list(reqs[0].prompt_ids)
    return out


def answer_id(chat: bool) -> str:
    return f"{'chatcmpl' if chat else 'cmpl'}-{uuid.uuid4().hex}"


def served_name(reqs: list[GenRequest], model: Any) -> str:
    """What an answer names as its model: the adapter the requests ran on, else the served model."""
    return (reqs[0].adapter if reqs else None) or model.name


def _envelope(chat: bool, reqs: list[GenRequest], model: Any, choices: list[dict[str, Any]],
              completion_tokens: int) -> dict[str, Any]:
    return {"id": answer_id(chat), "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()), "model": served_name(reqs, model), "choices": choices,
            "usage": usage_of(reqs, completion_tokens)}


def _entry(piece: str, logprob: float) -> dict[str, Any]:
    return {"token": piece, "logprob": logprob, "bytes": list(piece.encode())}


def completion_logprobs(tok: Any, ids: list[int], logprobs: list[float], tops: list[dict[int, float]], shape: Shape,
                        start: int = 0) -> dict[str, Any]:
    """A text completion's logprobs object for these tokens; start: where their text begins in the choice's. Each
    position's top_logprobs holds its alternatives and, as vLLM's do, the sampled token."""
    texts = [tok.decode([t]) for t in ids]
    offsets = [start + sum(len(p) for p in texts[:k]) for k in range(len(texts))]
    tops = tops or [{}] * len(ids)
    return {"tokens": [shape.name(tok, t) for t in ids], "token_logprobs": list(logprobs), "text_offset": offsets,
            "top_logprobs": [{shape.name(tok, t): lp, **{shape.name(tok, a): b for a, b in top.items()}}
                             for t, lp, top in zip(ids, logprobs, tops)]}


def prompt_logprobs(tok: Any, positions: list[dict[int, tuple[float, int]] | None], shape: Shape) -> list[Any]:
    """A choice's prompt_logprobs as vLLM's server writes them: per prompt position, None at the first, then
    {token id: {"logprob", "rank", "decoded_token"}} for the most likely tokens and the prompt's own."""
    return [None if pos is None else {str(t): {"logprob": lp, "rank": rank, "decoded_token": shape.name(tok, t)}
                                      for t, (lp, rank) in pos.items()} for pos in positions]


def chat_logprobs(tok: Any, ids: list[int], logprobs: list[float], tops: list[dict[int, float]],
                  shape: Shape) -> dict[str, Any]:
    """A chat choice's logprobs object ({"content": [...]}) for these tokens."""
    def entry(t: int, lp: float) -> dict[str, Any]:
        return {**_entry(tok.decode([t]), lp), "token": shape.name(tok, t)}

    return {"content": [{**entry(t, lp), "top_logprobs": [entry(a, b) for a, b in top.items()]}
                        for t, lp, top in zip(ids, logprobs, tops or [{}] * len(ids))]}


def models_response(model: Any, adapters: Any, created: float) -> dict[str, Any]:
    """GET /v1/models: the served model, then each loaded adapter with the model as its parent."""
    entry = {"object": "model", "created": int(created), "owned_by": "rlgen", "max_model_len": model.max_model_len}
    rows = [{"id": model.name, "root": model.path, "parent": None, **entry}]
    rows += [{"id": name, "root": path, "parent": model.name, **entry} for name, path in sorted(dict(adapters).items())]
    return {"object": "list", "data": rows}


def model_response(model: Any, adapters: Any, created: float, model_id: str) -> dict[str, Any]:
    """GET /v1/models/{id}: the row of /v1/models with that id (the served model also by its path); 404 else."""
    rows = models_response(model, adapters, created)["data"]
    found = next((r for r in rows if model_id == r["id"] or (r["parent"] is None and model_id == model.path)), None)
    if found is None:
        names = ", ".join(repr(r["id"]) for r in rows)
        raise BadRequest(f"model {model_id!r} is not served here; this server serves {names} (GET /v1/models lists "
                         "them).", status=404)
    return found
