"""The hf engine: transformers generate() behind the engine contract (rlgen.engines.contract). CPU default and
validation reference.

Token-in/token-out. The logprob reported for a sampled token is log_softmax(logits / temperature) at that
token (no top-p renormalisation), the same quantity the learner recomputes.
"""

from __future__ import annotations

import dataclasses
import queue
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from rlgen.config import EngineConfig
from rlgen.engines.cancel import CANCELLED, next_event
from rlgen.engines.cut_short import Until
from rlgen.engines.episodes import Episodic, is_episodes
from rlgen.engines.hf.adapters import EngineAdapters
from rlgen.engines.hf.attention import use_causal_sdpa
from rlgen.engines.hf.sampling import generate_kwargs, ranked_logprobs, top_logprobs
from rlgen.engines.hf.stream import Cancelled, StepStreamer
from rlgen.engines.hf.until import UntilCriterion
from rlgen.engines.kept_warm import KeptWarm
from rlgen.generated import GenResult
from rlgen.hostinfo import process_info
from rlgen.phases import ActorClock
from rlgen.types import Completion, GenRequest, Phase, SamplingParams

_DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "auto": None}


def _dtype(name: str | None, device: str) -> torch.dtype:
    """engine.dtype as torch's; null (outside a plan) as "auto"."""
    name = name or "auto"
    if name not in _DTYPES:
        raise ValueError(f"engine.dtype={name!r} is not one of {', '.join(_DTYPES)}.")
    d = _DTYPES[name]
    if d is None:
        return torch.bfloat16 if device.startswith("cuda") else torch.float32
    if device == "cpu" and d != torch.float32:
        return torch.float32  # half precision generate on CPU is slow and unsupported in places
    return d


def left_pad(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    """rows -> (ids [N, P], attention_mask [N, P]) left-padded to the longest row."""
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        if r:
            ids[i, width - len(r) :] = torch.tensor(r, dtype=torch.long)
            mask[i, width - len(r) :] = 1
    return ids, mask


class HFEngine(Episodic, KeptWarm):
    one_seed_per_batch = True  # one generate() call samples its whole batch from one seed

    def __init__(
        self,
        model_path: str,
        engine: EngineConfig,
        device: str = "cpu",
        seed: int = 0,
        name: str = "engine0",
        threads: int | None = 1,
        version: int = 0,
    ):
        """version: the policy version of the weights in model_path (a resumed run starts from a checkpoint's)."""
        self.clock = ActorClock()
        from transformers import AutoModelForCausalLM

        self.clock.step("import transformers")

        if threads and device == "cpu":
            torch.set_num_threads(threads)
        t0 = time.time()
        self.name, self.device, self.seed = name, device, seed
        self.dtype = _dtype(engine.dtype, device)
        self.max_batch = max(1, engine.max_num_seqs)
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=self.dtype).to(device).eval()
        if getattr(self.model.config, "_attn_implementation", None) == "sdpa":  # GQA in float32 at any length
            use_causal_sdpa(self.model)
        self.adapters = EngineAdapters(self.model)  # LoRA: the policy adapter and named ones, injected on arrival
        self.clock.step("weights")
        gen = self.model.generation_config
        self.eos_ids = self._as_list(gen.eos_token_id) or self._as_list(self.model.config.eos_token_id)
        self.pad_id = gen.pad_token_id if gen.pad_token_id is not None else (self.eos_ids[0] if self.eos_ids else 0)
        self.version = self.folder_version = int(version)
        self.model_path = model_path
        self.calls = 0
        self.tokens = 0  # generated, returned or not: a cancelled stream stops adding to it
        self.asleep = False
        self.clock.done()
        self.start_s = time.time() - t0

    @staticmethod
    def _as_list(x: Any) -> list[int]:
        if x is None:
            return []
        return [int(v) for v in x] if isinstance(x, (list, tuple)) else [int(x)]

    # -- protocol ---------------------------------------------------------------------------------------
    def generate_some(self, requests: list[GenRequest], enough: int, version: int | None = None) -> GenResult:
        """generate(), ended once ``enough`` groups are done and every must_finish request is (CutsShort): the
        samples still running end with finish_reason "abort" and the tokens they had."""
        return self.generate(requests, version, _until=Until(requests, enough))

    def generate(self, requests: list[GenRequest], version: int | None = None, _emit: Any = None,
                 _cancel: threading.Event | None = None, _until: Until | None = None) -> GenResult:
        """_emit and _cancel: generate_stream's callback for each step's tokens, and its signal to stop early;
        _until: generate_some()'s stop."""
        if self.asleep:
            raise RuntimeError(f"{self.name} is asleep; call wake() before generate().")
        if is_episodes(requests):
            return self.play_episodes(requests)
        for r in requests:
            self.adapters.check(r.adapter)
        t0 = time.time()
        self.calls += 1
        # Rows are (request index, sample index); rows sharing sampling settings and adapter run in one generate call.
        by_params: dict[tuple, list[tuple[int, int]]] = defaultdict(list)
        for i, r in sorted(enumerate(requests), key=lambda ir: not ir[1].must_finish):  # those that must finish first
            s = r.sampling
            key = (dataclasses.replace(s, n=1, max_new_tokens=1), r.adapter)  # all but n and the length
            by_params[key].extend((i, j) for j in range(s.n))
        out: dict[tuple[int, int], Completion] = {}
        for rows in by_params.values():
            for k in range(0, len(rows), self.max_batch):
                chunk = rows[k : k + self.max_batch]
                if _until is not None and not _until.needs(chunk):  # enough groups are done: never started
                    out.update({(i, j): self._cut_short(requests[i]) for i, j in chunk})
                    continue
                for (i, j), c in zip(chunk, self._generate_rows(requests, chunk, _emit, _cancel, _until)):
                    out[(i, j)] = c
        completions = [out[(i, j)] for i, r in enumerate(requests) for j in range(r.sampling.n)]
        for i, r in enumerate(requests):
            if r.sampling.prompt_logprobs is not None:
                scored = self._prompt_logprobs(r)
                for j in range(r.sampling.n):
                    out[(i, j)].prompt_logprobs = scored
        return GenResult(completions=completions, version=self.version, spans=[(Phase.generate.value, t0, time.time())])

    def _cut_short(self, req: GenRequest) -> Completion:
        """A sample generate_some() never started: cut short with no tokens."""
        return Completion(group_id=req.group_id, prompt_ids=list(req.prompt_ids), token_ids=[], logprobs=[],
                          finish_reason="abort", version=self.version)

    @torch.no_grad()
    def _generate_rows(self, requests: list[GenRequest], rows: list[tuple[int, int]], emit: Any = None,
                       cancel: threading.Event | None = None, until: Until | None = None) -> list[Completion]:
        s: SamplingParams = requests[rows[0][0]].sampling
        prompts = [list(requests[i].prompt_ids) for i, _ in rows]
        limits = [requests[i].sampling.max_new_tokens for i, _ in rows]
        ids, mask = left_pad(prompts, self.pad_id)
        ids, mask = ids.to(self.device), mask.to(self.device)
        stops = list(s.stop_token_ids) + ([] if s.ignore_eos else self.eos_ids)
        # A request's seed fixes its samples: the same requests give the same completions in a re-sent call (an
        # engine restarted mid-step) or a resumed run. Without one, the engine's seed and call count vary them.
        base = s.seed if s.seed is not None else self.seed * 1_000_003 + self.calls * 7919
        torch.manual_seed(base * 1_000_003 + rows[0][0])
        greedy = s.temperature <= 0
        streaming: dict[str, Any] = {}
        if emit is not None:
            streaming["streamer"] = StepStreamer(self.model, rows, s.temperature, s.logprobs, set(stops), list(limits),
                                                 emit)
        streaming["stopping_criteria"] = [Cancelled(cancel)]  # a cancelled call stops at its next step
        if until is not None:
            streaming["stopping_criteria"].append(UntilCriterion(until, rows, limits, set(stops), ids.shape[1]))
        with self.adapters.active(requests[rows[0][0]].adapter):
            out = self.model.generate(
                input_ids=ids,
                attention_mask=mask,
                **generate_kwargs(s, ids.shape[1]),
                max_new_tokens=max(limits),
                min_new_tokens=max(limits) if s.ignore_eos and not s.stop_token_ids else None,
                eos_token_id=stops or None,
                pad_token_id=self.pad_id,
                return_dict_in_generate=True,
                output_logits=True,
                **streaming,
            )
        new = out.sequences[:, ids.shape[1] :]  # [N, L]
        logits = torch.stack(out.logits, dim=1).float()  # [N, L, V]
        if not greedy:
            logits = logits / s.temperature
        full = torch.log_softmax(logits, dim=-1)  # [N, L, V]
        logp = full.gather(-1, new.unsqueeze(-1)).squeeze(-1)  # [N, L]
        stop_set = set(stops)
        kept = []  # (request index, tokens, finish reason) per row
        for r, ((i, _), limit) in enumerate(zip(rows, limits)):
            toks = new[r].tolist()[:limit]
            reason = "length" if until is None or len(toks) >= limit else "abort"
            for t_idx, t in enumerate(toks):
                if t in stop_set:
                    toks, reason = toks[: t_idx + 1], "stop"
                    break
            kept.append((i, toks, reason))
            self.tokens += len(toks)
        tops = top_logprobs(full, s.logprobs, [len(toks) for _, toks, _ in kept])
        return [Completion(group_id=requests[i].group_id, prompt_ids=list(requests[i].prompt_ids), token_ids=toks,
                           logprobs=logp[r, : len(toks)].tolist(), finish_reason=reason, version=self.version,
                           top_logprobs=tops[r])
                for r, (i, toks, reason) in enumerate(kept)]

    def generate_stream(self, requests: list[GenRequest],
                        cancel: threading.Event | None = None) -> Iterator[dict[str, Any]]:
        """generate(), streamed: {"deltas": [(request, sample, tokens, logprobs, top logprobs), ...]} as each step
        is sampled, then {"final": generate()'s result}. Closing the iterator early, or setting ``cancel`` (from
        any thread), stops generation at the next step."""
        events: queue.Queue = queue.Queue()
        cancel, box = cancel or threading.Event(), {}

        def work() -> None:
            try:
                box["out"] = self.generate(requests, None, events.put, cancel)
            except BaseException as err:  # noqa: BLE001 - raised below, in the consumer's thread
                box["err"] = err
            finally:
                events.put(None)

        thread = threading.Thread(target=work, name=f"{self.name}-stream", daemon=True)
        thread.start()
        try:
            while (deltas := next_event(events, cancel)) is not None:
                if deltas is CANCELLED:  # passed on to the generation, which stops at its next step
                    cancel.set()
                    continue
                yield {"deltas": deltas}
        finally:
            cancel.set()  # a no-op once generation has finished; else it stops at the next step
            thread.join()
        if "err" in box:
            raise box["err"]
        yield {"final": box["out"]}

    @torch.no_grad()
    def _prompt_logprobs(self, req: GenRequest) -> list[dict[int, tuple[float, int]] | None]:
        """The request's prompt scored as vLLM's prompt_logprobs: the model's own distribution (no temperature)."""
        ids = torch.tensor([req.prompt_ids], dtype=torch.long, device=self.device)
        with self.adapters.active(req.adapter):
            logits = self.model(input_ids=ids).logits[0, :-1].float()  # position t: the distribution of token t + 1
        return [None, *ranked_logprobs(torch.log_softmax(logits, dim=-1), list(req.prompt_ids[1:]),
                                       int(req.sampling.prompt_logprobs or 0))]

    @torch.no_grad()
    def score(self, prompt_ids: list[list[int]], token_ids: list[list[int]], temperature: float = 1.0,
              adapter: str | None = None) -> list[list[float]]:
        """Teacher-forced logprobs of token_ids after prompt_ids, one list per row (the validation reference),
        with a named adapter, or the policy."""
        rows = [p + t for p, t in zip(prompt_ids, token_ids)]
        ids, mask = left_pad(rows, self.pad_id)
        ids, mask = ids.to(self.device), mask.to(self.device)
        pos = (mask.cumsum(-1) - 1).clamp(min=0)
        keep = max(map(len, token_ids), default=0) + 1  # rows end together: only the last positions are scored, so
        with self.adapters.active(adapter):  # a long prompt costs no [T, V] logits
            logits = self.model(input_ids=ids, attention_mask=mask, position_ids=pos,
                                logits_to_keep=keep).logits.float()  # [N, keep, V]
        if temperature > 0:
            logits = logits / temperature
        tail = ids[:, ids.shape[1] - keep + 1 :]  # the tokens the kept positions predict
        logp = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, tail.unsqueeze(-1)).squeeze(-1)  # [N, keep-1]
        return [logp[r, logp.shape[1] - len(t) :].tolist() for r, t in enumerate(token_ids)]

    def update_weights(self, weights: dict[str, torch.Tensor], version: int) -> dict[str, Any]:
        t0 = time.time()
        state = self.adapters.base_names({k: v.to(device=self.device, dtype=self.dtype) for k, v in weights.items()})
        missing, unexpected = self.model.load_state_dict(state, strict=False)
        real_missing = [k for k in missing if ".lora_" not in k and (not k.endswith("lm_head.weight")
                                                                       or not self.model.config.tie_word_embeddings)]
        if real_missing or unexpected:
            raise ValueError(f"{self.name}: weights do not match the model (missing {real_missing[:3]}, unexpected {unexpected[:3]}).")
        self.version = int(version)
        return {"version": self.version, "spans": [(Phase.sync.value, t0, time.time())]}

    def reset_prefix_cache(self) -> bool:
        """Nothing to drop: generate() keeps no cache between calls."""
        return True

    # -- LoRA adapters (rlgen.engines.hf.adapters) ----------------------------------------------------------
    def load_adapter(self, adapter: dict[str, Any], version: int, timeout_s: float | None = None) -> dict[str, Any]:
        """Make ``adapter`` ({"tensors", "config"}, as a LoRA learner exports it) the policy at ``version``:
        requests that name no adapter run on it from now on."""
        t0 = time.time()
        self.adapters.load_policy({"tensors": {k: v.to(self.device) for k, v in adapter["tensors"].items()},
                                   "config": adapter["config"]})
        self.version = int(version)
        t1 = time.time()
        return {"actor": self.name, "version": self.version, "spans": [(Phase.sync.value, t0, t1)], "seconds": t1 - t0,
                "bytes": sum(t.numel() * t.element_size() for t in adapter["tensors"].values())}

    def add_adapter(self, name: str, path: str) -> dict[str, Any]:
        """Load the PEFT adapter folder at path under ``name``, for the requests that name it."""
        self.adapters.add(name, path)
        self.model.to(self.device)
        return {"adapters": self.adapters.names()}

    def remove_adapter(self, name: str) -> dict[str, Any]:
        self.adapters.remove(name)
        return {"adapters": self.adapters.names()}

    def sleep(self, level: int = 1) -> None:
        if self.device != "cpu":
            self.model.to("cpu")
            torch.cuda.empty_cache()
        self.asleep = True

    def wake(self, tags: list[str] | None = None) -> None:
        """All of it, whatever the tags: the model is one piece, and there is no KV cache kept between calls."""
        if self.device != "cpu":
            self.model.to(self.device)
        self.asleep = False

    def _sleeps_while_kept(self) -> bool:
        return self.device != "cpu"

    def _restore_start_weights(self) -> bool:
        """The model folder's safetensors files again (False for a folder without them)."""
        from safetensors.torch import load_file

        files = sorted(Path(self.model_path).glob("*.safetensors"))
        if not files or self.adapters.names():
            return False
        weights: dict[str, torch.Tensor] = {}
        for f in files:
            weights.update(load_file(str(f)))
        self.update_weights(weights, self.folder_version)
        return True

    def health(self) -> dict[str, Any]:
        return {"ok": True, "name": self.name, "version": self.version, "asleep": self.asleep, "start_s": self.start_s,
                "adapters": self.adapters.names(), "dtype": str(self.dtype).removeprefix("torch."), "tokens": self.tokens,
                "startup": self.clock.to_dict(), **process_info()}
