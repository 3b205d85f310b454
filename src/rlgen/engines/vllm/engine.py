"""The vllm engine: vLLM 0.26's AsyncLLM behind the engine protocol. One engine per Ray actor on its own GPU(s).

Token-in/token-out, with the logprob of each sampled token (the quantity the learner recomputes). A plain class
that owns a daemon thread running one asyncio loop (``rlgen.engines.vllm.loop``), so any thread of a threaded
actor can call in while a ``generate()`` is in flight; docs/architecture.md says why it is not an async actor.
vllm is imported only when an engine is built. Its parts: engine arguments and seeds (``args``), weight updates
(``updates``; the functions its workers run are ``rlgen.sync.receiver``), LoRA (``adapters``), streaming
(``stream``), the logprobs of its outputs (``outputs``), stored KV-cache sizes (``kvcache``), what vLLM's sampler
warm-up samples with (``warmup``).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import threading
import time
from typing import Any

from rlgen.config import EngineConfig
from rlgen.engines.cut_short import Until
from rlgen.engines.episodes import Episodic, is_episodes
from rlgen.engines.kept_warm import KeptWarm
from rlgen.engines.vllm.adapters import AdapterFolders, AdapterMethods
from rlgen.engines.vllm.args import (
    REQUIRED_ENV,
    TUNED_DEFAULTS,
    VLLM_MAX_LOGPROBS,
    build_engine_args,
    mix_seed,
)
from rlgen.engines.vllm.common import CALL_TIMEOUT_S, CONTROL_TIMEOUT_S, START_TIMEOUT_S, EngineError
from rlgen.engines.vllm.fork import FORK, FORK_FAILED, choose_core_start, spawn_from_now
from rlgen.engines.vllm.kvcache import KVSizes, MeasuredWatch, engine_versions
from rlgen.engines.vllm.loop import (
    LoopThread,
    build_engine,
    generate_all,
    generate_until,
    running_requests,
    version_changes,
)
from rlgen.engines.vllm.outputs import prompt_logprobs, sampled_logprobs, top_logprobs
from rlgen.engines.vllm.startup import (
    EngineStartError,
    check_free_memory,
    explain,
    own_logs,
    own_stderr_tail,
    require_cuda_and_vllm,
)
from rlgen.engines.vllm.stream import StreamMethods
from rlgen.engines.vllm.updates import UpdateMethods
from rlgen.engines.vllm.warmup import ALL, ROLLOUTS, set_sampler_warmup
from rlgen.generated import GenResult
from rlgen.hostinfo import process_info
from rlgen.phases import ActorClock, read_log_times
from rlgen.types import Completion, GenRequest, Phase, tail_start


class VLLMEngine(AdapterMethods, StreamMethods, UpdateMethods, Episodic, KeptWarm):
    """vLLM AsyncLLM engine: Engine and every capability its spec claims (rlgen.engines.contract).

    ``engine_args`` overrides or extends the AsyncEngineArgs built from ``engine`` (for settings EngineConfig
    does not carry, e.g. ``max_num_batched_tokens`` or ``cudagraph_capture_sizes``). ``env`` is applied to
    this process before vllm is imported, so the engine-core processes vLLM spawns inherit it.
    """

    def __init__(
        self,
        model_path: str,
        engine: EngineConfig,
        device: str = "cuda",
        seed: int = 0,
        name: str = "engine0",
        env: dict[str, str] | None = None,
        engine_args: dict[str, Any] | None = None,
        timeout_s: float = CALL_TIMEOUT_S,
        version: int = 0,
        sampler_warmup: str = ROLLOUTS,
    ):
        t0 = time.time()
        self.clock = ActorClock()
        if not str(device).startswith("cuda"):
            raise EngineError(
                f"engine=vllm runs on CUDA GPUs only, but device={device!r} was given; use engine=hf on CPU."
            )
        os.environ.update({k: str(v) for k, v in (env or {}).items()})
        for k, v in REQUIRED_ENV.items():
            os.environ.setdefault(k, v)
        require_cuda_and_vllm()
        self.core_start = choose_core_start()  # fork, or spawn where fork is not safe
        self.sampler_warmup = set_sampler_warmup(sampler_warmup) if self.core_start == FORK else ALL  # see warmup
        self.clock.step("import vllm")

        self.name, self.seed, self.timeout_s = name, seed, timeout_s
        self.engine_cfg = engine
        self.version = int(version)  # of the weights in model_path (a resumed run starts from a checkpoint's)
        self.folder_version = self.version
        self.base_replaced = False  # whole weights loaded since the start: the model folder's are gone
        self.asleep = False
        self.slept_level = 0  # the level of the last sleep(); 2 dropped the weights, which then need a full reload
        self.weights_on_gpu = True  # False between sleep() and a wake() that brings the weights back
        self.paused = False
        # Set by init_weight_transfer(): prompts carry a per-version cache_salt, so a request never reuses
        # prefix-cache blocks computed under another policy version, even when the cache could not be reset
        # after an in-flight update (requests frozen by pause(mode="keep") still hold their blocks).
        self.salt_prefix_cache = False
        self._calls = 0
        self._update_t0 = 0.0  # when the IPC update under way began (its first chunk)
        # (request id, sample index) -> [(tokens sampled before an in-flight update, the new version)], filled while
        # paused and taken by the generate() call that owns the request
        self._version_changes: dict[tuple[str, int], list[tuple[int, int]]] = {}
        self._lock = threading.Lock()
        self.lora_request: Any = None  # the adapter new requests use (LoRA: learner.lora.sync=adapter)
        self.named_loras: dict[str, Any] = {}  # adapters loaded by name (rlgen serve), for requests that name them
        self._named_count = 0
        self._adapters = AdapterFolders(name)
        self.model_path, self.args = model_path, build_engine_args(model_path, engine, seed, engine_args)
        check_free_memory(name, self.args["gpu_memory_utilization"])
        self.kv_size = "given" if "kv_cache_memory_bytes" in self.args else "measured"
        sizes = KVSizes(self.args, engine_versions())
        self._loop = LoopThread(name)
        watch: MeasuredWatch | None = None
        try:
            # vLLM measures the KV cache's size alone on the GPU, or takes the given or stored one beside others
            with sizes.start_slot(name, START_TIMEOUT_S, given=self.kv_size == "given") as stored:
                self.clock.step("wait for the GPU's start lock")
                if stored and self.kv_size == "measured":
                    self.args["kv_cache_memory_bytes"], self.kv_size = stored, "stored"
                if self.kv_size == "measured":  # the engines waiting for this one start once it has its size
                    watch = MeasuredWatch(sizes, own_logs)
                with watch if watch else contextlib.nullcontext():
                    self.llm = self._build_llm()
                if self.kv_size == "measured":
                    cache = self.llm.vllm_config.cache_config
                    sizes.record(cache.num_gpu_blocks, cache.block_size)
            self._loop.dead = lambda: bool(getattr(self.llm, "errored", False))  # its core process exited
        except BaseException as err:
            self._loop.close()
            if self.kv_size == "stored" or (watch and watch.handed):
                sizes.forget()  # the next start measures again
            why = explain(own_stderr_tail()) or explain(str(err))  # vLLM's root cause is in the core's stderr
            if why:
                raise EngineStartError(name, why) from err
            raise
        self.clock.step(f"vLLM engine start ({self.core_start})")
        # vLLM's own lines (its engine core's too) are in this worker's logs: they time weights, compile, graphs
        read_log_times(self.clock, own_logs())
        self.clock.done()
        self.start_s = time.time() - t0

    def _build_llm(self) -> Any:
        """AsyncLLM for self.args; a forked engine core that could not use CUDA is started again by spawn."""
        what = f"{self.name}: starting the vLLM engine"
        try:
            return self._loop.run(build_engine(self.args), START_TIMEOUT_S, what)
        except Exception as err:
            if self.core_start != FORK or FORK_FAILED not in own_stderr_tail() + str(err):
                raise
        self.core_start = spawn_from_now()
        return self._loop.run(build_engine(self.args), START_TIMEOUT_S, what)

    # -- generation -------------------------------------------------------------------------------------
    def _sampling(self, req: GenRequest, stream: bool = False, sample: int | None = None) -> Any:
        """vLLM's sampling params of a request; sample=j: its j-th sample alone, with the seed vLLM gives that
        sample inside the request."""
        from vllm.sampling_params import RequestOutputKind
        from vllm.sampling_params import SamplingParams as VSamplingParams

        s = req.sampling
        extra: dict[str, Any] = {}  # server-only settings, passed only when set (rollouts keep vLLM's defaults)
        if not s.plain():
            extra = {k: v for k, v in (("top_k", s.top_k), ("min_p", s.min_p), ("frequency_penalty", s.frequency_penalty),
                                       ("presence_penalty", s.presence_penalty)) if v}
            if s.repetition_penalty != 1.0:
                extra["repetition_penalty"] = s.repetition_penalty
            if s.logit_bias:
                extra["logit_bias"] = dict(s.logit_bias)
        if s.prompt_logprobs is not None:
            extra["prompt_logprobs"] = s.prompt_logprobs
        return VSamplingParams(
            **extra,
            n=s.n if sample is None else 1,
            temperature=s.temperature,
            top_p=s.top_p,
            max_tokens=s.max_new_tokens,
            stop_token_ids=list(s.stop_token_ids) or None,
            ignore_eos=s.ignore_eos,
            seed=mix_seed(s.seed, req.group_id) if sample is None or s.seed is None else
            mix_seed(s.seed, req.group_id) + sample,
            logprobs=s.logprobs,  # the sampled token's logprob, and the top alternatives when asked for
            flat_logprobs=True,  # a few flat lists per request instead of one dict per token
            detokenize=False,
            output_kind=RequestOutputKind.DELTA if stream else RequestOutputKind.FINAL_ONLY,
        )

    def _prompt(self, req: GenRequest) -> Any:
        from vllm.inputs import TokensPrompt

        prompt = TokensPrompt(prompt_token_ids=list(req.prompt_ids))
        if self.salt_prefix_cache:
            prompt["cache_salt"] = f"{self.name}-v{self.version}"
        return prompt

    def generate(self, requests: list[GenRequest], version: int | None = None) -> GenResult:
        """n completions per request, in request order, each tagged with the policy version that was loaded
        when the call started (pause()/update_weights()/resume() during a call can mix versions)."""
        if self.asleep:
            raise EngineError(f"{self.name} is asleep; call wake() before generate().")
        if is_episodes(requests):
            return self.play_episodes(requests)
        t0 = time.time()
        call, v, jobs = self._jobs(requests)
        finished: list[float] = []
        outs = self._loop.run(
            generate_all(self.llm, jobs, finished),
            self.timeout_s,
            f"{self.name}: generate() of {len(requests)} requests",
        )
        t1 = time.time()
        return GenResult(completions=self._completions(requests, outs, call, v), version=v,
                         spans=[(Phase.generate.value, t0, t1)], tail_from=tail_start(finished))

    def _play_episodes(self, episodes: Any) -> tuple[list[Completion], float]:
        """Every episode a coroutine on the engine's loop, beside vLLM's own: no thread per episode. (The turn's
        coroutine is made here: an actor class with an ``async def`` method would be an async actor to Ray.)"""

        async def turn(requests: list[GenRequest]) -> GenResult:
            call, v, jobs = self._jobs(requests)
            outs = await asyncio.wait_for(generate_all(self.llm, jobs), self.timeout_s)
            return GenResult(completions=self._completions(requests, outs, call, v), version=v)

        spec = episodes.requests[0].episode
        bound = (self.timeout_s + spec.env_timeout_s) * (spec.max_turns + 1)
        return self._loop.run(episodes.play(turn), bound, f"{self.name}: {len(episodes.requests)} requests' episodes")

    def generate_some(self, requests: list[GenRequest], enough: int, version: int | None = None) -> GenResult:
        """generate(), ended once ``enough`` groups are done and every must_finish request is (CutsShort): the
        samples still running end with finish_reason "abort" and the tokens they had. Each sample is a request of
        its own (the seed vLLM gives it inside an n-sample request), so one that is done is kept whole."""
        if self.asleep:
            raise EngineError(f"{self.name} is asleep; call wake() before generate_some().")
        t0 = time.time()
        call = self._next_call()
        v = self.version
        rows = [(i, j) for i, r in enumerate(requests) for j in range(r.sampling.n)]
        jobs = [(self._prompt(requests[i]), self._sampling(requests[i], sample=j), f"{self.name}-{call}-{i}-{j}",
                 self._lora_of(requests[i])) for i, j in rows]
        states: dict[str, Any] = {}

        def running(rid: str) -> tuple[list[int], list[float]]:
            if not states:
                states.update(running_requests(self.llm))
            return self._so_far(states.get(rid))

        outs = self._loop.run(generate_until(self.llm, jobs, [i for i, _ in rows], Until(requests, enough), running),
                              self.timeout_s, f"{self.name}: generate_some() of {len(requests)} requests")
        changes = self._changes_of(call)
        completions = []
        for (i, _), job, out in zip(rows, jobs, outs):
            if isinstance(out, tuple):  # cut short: the tokens it had
                toks, logprobs, reason = out[0], out[1], "abort"
            else:
                o = out.outputs[0]
                toks, reason = list(o.token_ids), o.finish_reason
                logprobs = sampled_logprobs(toks, o.logprobs)
            completions.append(self._completion(requests[i], job[2], 0, toks, logprobs, [], reason, v, changes))
        return GenResult(completions=completions, version=v, spans=[(Phase.generate.value, t0, time.time())])

    def _so_far(self, state: Any) -> tuple[list[int], list[float]]:
        """A running request's tokens and their logprobs, from vLLM's state of it; none where it cannot be read
        (the sample then starts again from its prompt, which is as correct and only slower)."""
        try:
            toks = [int(t) for t in state.detokenizer.output_token_ids]
            return toks, sampled_logprobs(toks, state.logprobs_processor.logprobs)
        except Exception:  # noqa: BLE001 - vLLM internals that moved: nothing is kept of this sample
            return [], []

    def _next_call(self) -> int:
        """A new call's number, which its requests' ids carry."""
        with self._lock:
            self._calls += 1
            return self._calls

    def _jobs(self, requests: list[GenRequest]) -> tuple[int, int, list[tuple[Any, Any, str, Any]]]:
        """This call's number, the version it starts under, and its vLLM jobs."""
        call = self._next_call()
        jobs = [(self._prompt(r), self._sampling(r), f"{self.name}-{call}-{i}", self._lora_of(r))
                for i, r in enumerate(requests)]
        return call, self.version, jobs

    def _changes_of(self, call: int) -> dict[tuple[str, int], list[tuple[int, int]]]:
        """This call's in-flight version changes, by request id and sample index (taken out of the engine's)."""
        with self._lock:
            return {key: self._version_changes.pop(key) for key in list(self._version_changes)
                    if key[0].startswith(f"{self.name}-{call}-")}

    def _completion(self, req: GenRequest, rid: str, index: int, toks: list[int], logprobs: list[float],
                    tops: list[dict[int, float]], reason: str, v: int,
                    changes: dict[tuple[str, int], list[tuple[int, int]]], prompt_logprobs: Any = ()) -> Completion:
        return Completion(group_id=req.group_id, prompt_ids=list(req.prompt_ids), token_ids=toks, logprobs=logprobs,
                          top_logprobs=tops, prompt_logprobs=list(prompt_logprobs), finish_reason=reason, version=v,
                          version_changes=version_changes(changes.get((rid, index), []), v, len(toks)))

    def _completions(self, requests: list[GenRequest], outs: list[Any], call: int, v: int) -> list[Completion]:
        completions: list[Completion] = []
        changes = self._changes_of(call)
        for i, (req, out) in enumerate(zip(requests, outs)):
            samples = sorted(out.outputs, key=lambda o: o.index)
            if len(samples) != req.sampling.n:
                raise EngineError(
                    f"{self.name}: asked for n={req.sampling.n} samples, vLLM returned {len(samples)}."
                )
            for o in samples:
                if o.finish_reason not in ("stop", "length"):
                    raise EngineError(f"{self.name}: a request ended with finish_reason={o.finish_reason!r}.")
                toks = list(o.token_ids)
                completions.append(self._completion(
                    req, f"{self.name}-{call}-{i}", o.index, toks, sampled_logprobs(toks, o.logprobs),
                    top_logprobs(o.logprobs, req.sampling.logprobs, len(toks)), o.finish_reason, v, changes,
                    prompt_logprobs(out)))
        return completions

    # -- memory and scheduling --------------------------------------------------------------------------
    def sleep(self, level: int = 1) -> None:
        """Free GPU memory: level 1 moves weights to CPU and drops the KV cache; level 2 drops the weights
        too (load them again with update_weights() after wake())."""
        if not self.args.get("enable_sleep_mode"):
            raise EngineError(f"{self.name} was built without sleep mode; set engine.enable_sleep_mode=true.")
        self._loop.run(self.llm.sleep(level), CONTROL_TIMEOUT_S, f"{self.name}: sleep({level})")
        self.asleep, self.slept_level = True, int(level)
        self.weights_on_gpu = False

    def wake(self, tags: list[str] | None = None) -> None:
        """Give memory back: tags=None all of it; ["weights"] the weights only (then load new ones), then
        ["kv_cache"]. The engine counts as asleep until its KV cache is back."""
        self._loop.run(self.llm.wake_up(tags), CONTROL_TIMEOUT_S, f"{self.name}: wake({tags or ''})")
        if tags is None or "weights" in tags:
            self.weights_on_gpu = True
        if tags is None or "kv_cache" in tags:
            self.asleep = False

    def pause(self, mode: str = "keep", clear_cache: bool = False) -> None:
        """Stop scheduling. mode="keep" freezes in-flight requests with their KV cache (they go on after
        resume()); "wait" lets them finish first; "abort" ends them."""
        self._loop.run(
            self.llm.pause_generation(mode=mode, clear_cache=clear_cache),
            CONTROL_TIMEOUT_S,
            f"{self.name}: pause()",
        )
        self.paused = True

    def resume(self) -> None:
        self._loop.run(self.llm.resume_generation(), CONTROL_TIMEOUT_S, f"{self.name}: resume()")
        self.paused = False

    def _tidy(self) -> None:
        """Between runs (KeptWarm): requests go on, no adapters, no prefixes cached under the old weights (asleep,
        the KV cache is gone already; the reload of the starting weights drops the prefix cache again). An engine
        asleep at level 2 has dropped its weights: it is not kept."""
        if self.asleep and self.slept_level == 2:
            raise EngineError(f"{self.name} is asleep at level 2 (its weights dropped), so it is not kept warm.")
        if self.paused:
            self.resume()
        self.lora_request = None
        self.named_loras.clear()
        with self._lock:
            self._version_changes.clear()
        if not self.asleep:
            self._loop.run(self.llm.reset_prefix_cache(), CONTROL_TIMEOUT_S, f"{self.name}: prefix-cache reset")

    def _restore_start_weights(self) -> bool:
        """vLLM's reload_weights: each worker reads the model folder again into its weights (in place: CUDA graphs
        and sleep mode go on working); asleep at level 1, it wakes for it. Adapters alone leave the folder's weights
        in place; a LoRA build cannot reload (its layers name the base ``base_layer``): the next run's push does."""
        if not self.base_replaced:
            self.version = self.folder_version
            return True
        if self.args.get("enable_lora"):
            return False
        if self.asleep:
            self.wake()
        what = f"{self.name}: loading its model folder's weights again"
        self._loop.run(self.llm.collective_rpc("reload_weights", timeout=CONTROL_TIMEOUT_S), CONTROL_TIMEOUT_S, what)
        self._loop.run(self.llm.reset_prefix_cache(), CONTROL_TIMEOUT_S, f"{self.name}: prefix-cache reset")
        self.version = self.folder_version
        self.base_replaced = False
        return True

    def _sleeps_while_kept(self) -> bool:
        return bool(self.args.get("enable_sleep_mode"))

    def health(self) -> dict[str, Any]:
        """Cheap: reads state, does not queue behind generation."""
        ok = not self.llm.errored
        return {
            "ok": ok,
            "name": self.name,
            "version": self.version,
            "asleep": self.asleep,
            "paused": self.paused,
            "dtype": str(self.args.get("dtype")),
            "max_logprobs": self.args.get("max_logprobs", VLLM_MAX_LOGPROBS),  # vLLM refuses more, prompt's too
            "start_s": self.start_s,
            "kv_size": self.kv_size,  # the KV cache's size: measured by vLLM, stored by an earlier start, or given
            "core_start": self.core_start,  # how vLLM's engine-core process was started: fork or spawn
            "sampler_warmup": self.sampler_warmup,  # what vLLM's sampler warm-up sampled with: rollouts or all
            "startup": self.clock.to_dict(),
            **process_info(),
        }

    def shutdown(self) -> None:
        try:
            self.llm.shutdown()
        finally:
            self._loop.close()
            self._adapters.clear()


__all__ = [
    "EngineError",
    "REQUIRED_ENV",
    "TUNED_DEFAULTS",
    "VLLMEngine",
    "build_engine_args",
    "mix_seed",
    "require_cuda_and_vllm",
]
