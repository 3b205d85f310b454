"""What travels between ``rlgen serve`` and its clients: generation requests as JSON (the answers: rlgen.generated),
weights as safetensors bytes. Shared by the server and ``rlgen.wire.client`` so both read and write the same fields.
No torch import at module level."""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from typing import Any

from rlgen.types import GenRequest, SamplingParams

TOKEN_ENV = "RLGEN_SERVE_TOKEN"
MAX_LOGPROBS = 20  # the most alternatives a request may ask for per token (OpenAI's limit)
LOOPBACK = ("127.0.0.1", "localhost", "::1")


class BadRequest(ValueError):
    """A request the server refuses; the message says what to change. ``status`` is the HTTP status."""

    def __init__(self, message: str, status: int = 400):
        super().__init__(message)
        self.status = status


ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 404: "not_found_error", 405: "invalid_request_error",
               409: "invalid_request_error", 413: "invalid_request_error", 429: "rate_limit_error"}


def error_body(message: str, status: int) -> dict[str, Any]:
    """An error in OpenAI's shape, which its SDKs read: {"error": {"message", "type", "code"}}."""
    return {"error": {"message": message, "type": ERROR_TYPES.get(status, "server_error"), "param": None,
                      "code": status}}


def error_message(body: Any) -> str | None:
    """The sentence of an error body (OpenAI's shape, or a plain {"error": text})."""
    err = body.get("error") if isinstance(body, dict) else None
    if isinstance(err, dict):
        return str(err.get("message") or err)
    return str(err) if err else None


EXTRA_SAMPLING = ("top_k", "min_p", "repetition_penalty", "frequency_penalty", "presence_penalty", "logprobs")


def request_to_json(r: GenRequest) -> dict[str, Any]:
    s = r.sampling
    extra = {k: getattr(s, k) for k in EXTRA_SAMPLING if getattr(s, k) != getattr(SamplingParams, k)}
    if s.logit_bias:
        extra["logit_bias"] = {str(t): b for t, b in s.logit_bias}
    return {"prompt_ids": list(r.prompt_ids), "group_id": r.group_id, "n": s.n, "max_tokens": s.max_new_tokens,
            "temperature": s.temperature, "top_p": s.top_p, "stop_token_ids": list(s.stop_token_ids),
            "ignore_eos": s.ignore_eos, "seed": s.seed, **({"adapter": r.adapter} if r.adapter else {}), **extra}


def logit_bias(value: Any, vocab_size: int, where: str) -> tuple[tuple[int, float], ...]:
    """{token id (a number or its string): bias} -> sorted (id, bias) pairs, each id in the vocabulary."""
    if value is None:
        return ()
    if not isinstance(value, dict):
        raise BadRequest(f"{where}: logit_bias must map token ids to biases, such as {{\"50256\": -100}}.")
    try:
        pairs = sorted((int(k), float(v)) for k, v in value.items())
    except (TypeError, ValueError) as err:
        raise BadRequest(f"{where}: logit_bias must map token ids to numbers ({err}).") from err
    bad = [t for t, _ in pairs if not 0 <= t < vocab_size]
    if bad:
        raise BadRequest(f"{where}: logit_bias names token id {bad[0]}, outside the model's vocabulary of {vocab_size}.")
    if any(not -100 <= b <= 100 for _, b in pairs):
        raise BadRequest(f"{where}: logit_bias values must be in [-100, 100].")
    return tuple(pairs)


def sampling_extras(d: dict[str, Any]) -> dict[str, Any]:
    """The sampling fields beyond temperature and top-p that a request sets, typed (ValueError when one is not)."""
    types = {"top_k": int, "min_p": float, "repetition_penalty": float, "frequency_penalty": float,
             "presence_penalty": float, "logprobs": int}
    out = {k: cast(d[k]) for k, cast in types.items() if d.get(k) is not None}
    if out.get("top_k") == -1:  # vLLM's and OpenAI's "no cut"
        out["top_k"] = 0
    return out


def _int_list(value: Any, what: str) -> tuple[int, ...]:
    if not isinstance(value, list) or not all(isinstance(t, int) and not isinstance(t, bool) for t in value):
        raise BadRequest(f"{what} must be a list of integer token ids.")
    return tuple(value)


def request_from_json(d: Any, index: int, vocab_size: int, max_model_len: int) -> GenRequest:
    """One request of a /generate body, checked against the served model."""
    where = f"request {index}"
    if not isinstance(d, dict):
        raise BadRequest(f"{where} must be an object with prompt_ids and sampling fields.")
    known = {"prompt_ids", "group_id", "n", "max_tokens", "temperature", "top_p", "stop_token_ids", "ignore_eos", "seed",
             "adapter", "logit_bias", *EXTRA_SAMPLING}
    unknown = sorted(set(d) - known)
    if unknown:
        raise BadRequest(f"{where} has unknown field(s) {unknown}; the fields are {sorted(known)}.")
    prompt = _int_list(d.get("prompt_ids"), f"{where}: prompt_ids")
    if not prompt:
        raise BadRequest(f"{where}: prompt_ids is empty; send at least one token.")
    bad = [t for t in prompt if not 0 <= t < vocab_size]
    if bad:
        raise BadRequest(f"{where}: token id {bad[0]} is outside the model's vocabulary of {vocab_size}.")
    try:
        sampling = SamplingParams(
            n=int(d.get("n", 1)), temperature=float(d.get("temperature", 1.0)), top_p=float(d.get("top_p", 1.0)),
            max_new_tokens=int(d.get("max_tokens", 16)),
            stop_token_ids=_int_list(d.get("stop_token_ids", []), f"{where}: stop_token_ids"),
            ignore_eos=bool(d.get("ignore_eos", False)), seed=None if d.get("seed") is None else int(d["seed"]),
            logit_bias=logit_bias(d.get("logit_bias"), vocab_size, where), **sampling_extras(d))
        group_id = int(d.get("group_id", index))
    except (TypeError, ValueError) as err:
        raise BadRequest(f"{where}: {err}") from err
    adapter = d.get("adapter")
    if adapter is not None and (not isinstance(adapter, str) or not adapter):
        raise BadRequest(f"{where}: adapter must be the name of a loaded LoRA adapter (a string), or left out.")
    check_sampling(sampling, where)
    check_length(len(prompt), sampling.max_new_tokens, max_model_len, where)
    return GenRequest(prompt, sampling, group_id, adapter)


def check_length(prompt_tokens: int, max_tokens: int, max_model_len: int, where: str) -> None:
    if prompt_tokens + max_tokens > max_model_len:
        raise BadRequest(
            f"{where}: {prompt_tokens} prompt tokens + max_tokens {max_tokens} = {prompt_tokens + max_tokens} is over "
            f"this server's max_model_len of {max_model_len}; shorten it, or start the server with a larger "
            "engine.max_model_len.", status=413)


def check_sampling(s: SamplingParams, where: str) -> None:
    if s.n < 1:
        raise BadRequest(f"{where}: n={s.n} must be at least 1.")
    if s.max_new_tokens < 1:
        raise BadRequest(f"{where}: max_tokens={s.max_new_tokens} must be at least 1.")
    if s.temperature < 0:
        raise BadRequest(f"{where}: temperature={s.temperature} must be 0 (greedy) or more.")
    if not 0 < s.top_p <= 1:
        raise BadRequest(f"{where}: top_p={s.top_p} must be in (0, 1].")
    if s.top_k < 0 or not 0 <= s.min_p <= 1 or s.repetition_penalty <= 0:
        raise BadRequest(f"{where}: top_k={s.top_k} must be 0 (no cut) or more, min_p={s.min_p} in [0, 1] and "
                         f"repetition_penalty={s.repetition_penalty} above 0.")
    if not (-2 <= s.frequency_penalty <= 2 and -2 <= s.presence_penalty <= 2):
        raise BadRequest(f"{where}: frequency_penalty and presence_penalty must be in [-2, 2].")
    if not 0 <= s.logprobs <= MAX_LOGPROBS:
        raise BadRequest(f"{where}: logprobs={s.logprobs} must be in [0, {MAX_LOGPROBS}].")


def weights_to_bytes(weights: Mapping[str, Any] | Iterable[tuple[str, Any]]) -> bytes:
    """A name -> tensor mapping (or (name, tensor) pairs) as one safetensors blob. Tensors that share storage
    (tied embeddings) are sent once each under their own name."""
    from safetensors.torch import save

    items = weights.items() if isinstance(weights, Mapping) else weights
    out, seen = {}, set()
    for name, t in items:
        t = t.detach().to("cpu").contiguous()  # no copy for a CPU tensor that is contiguous already
        if t.untyped_storage().data_ptr() in seen:  # safetensors refuses shared storage
            t = t.clone()
        seen.add(t.untyped_storage().data_ptr())
        out[name] = t
    return save(out)


UPLOAD_CHUNK = 4 << 20


def chunks(blob: bytes, size: int = UPLOAD_CHUNK) -> Iterable[bytes]:
    """A large body in pieces: handed over whole, httpx's HTTP/1.1 writer slows down with the body's size
    (about 20 MB/s for 256 MB, against 450 MB/s in 4 MiB pieces, measured on loopback)."""
    view = memoryview(blob)
    for i in range(0, len(blob), size):
        yield bytes(view[i : i + size])


ADAPTER_CONFIG_KEY = "adapter_config"  # the safetensors metadata entry an adapter blob keeps its config in


def adapter_to_bytes(adapter: Mapping[str, Any]) -> bytes:
    """A LoRA adapter ({"tensors", "config"}, as a learner exports it) as one safetensors blob, its
    adapter_config.json contents in the metadata."""

    from safetensors.torch import save

    tensors = {k: t.detach().to("cpu").contiguous() for k, t in adapter["tensors"].items()}
    return save(tensors, metadata={ADAPTER_CONFIG_KEY: json.dumps(adapter["config"])})


def adapter_from_bytes(blob: bytes) -> dict[str, Any]:
    """adapter_to_bytes's blob -> {"tensors", "config"}."""

    tensors = weights_from_bytes(blob)
    try:
        header_len = int.from_bytes(blob[:8], "little")
        meta = json.loads(blob[8 : 8 + header_len]).get("__metadata__") or {}
        config = json.loads(meta[ADAPTER_CONFIG_KEY])
    except (ValueError, KeyError, TypeError) as err:
        raise BadRequest("the adapter blob has no adapter_config in its safetensors metadata; send it with rlgen's "
                         f"client (update_adapter) ({err}).") from err
    return {"tensors": tensors, "config": config}


def weights_from_bytes(blob: bytes) -> dict[str, Any]:
    from safetensors.torch import load

    try:
        return load(blob)
    except Exception as err:  # noqa: BLE001 - safetensors raises several types for a malformed blob
        raise BadRequest(f"the weights are not a safetensors blob ({err}).") from err


def split_by_samples(requests: list[GenRequest], parts: int) -> list[list[GenRequest]]:
    """Consecutive shards with about the same number of samples each (some may be empty)."""
    total = sum(r.sampling.n for r in requests)
    shards: list[list[GenRequest]] = [[] for _ in range(max(1, parts))]
    seen = 0
    for r in requests:
        k = min(len(shards) - 1, (2 * seen + r.sampling.n) * len(shards) // max(2 * total, 1))  # by its middle
        shards[k].append(r)
        seen += r.sampling.n
    return shards
