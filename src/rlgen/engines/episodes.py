"""Multi-turn episodes inside an engine: each sample of a request that carries an ``EpisodeSpec`` is played
against its environment (rlgen.tasks.envs) turn by turn, and comes back as one Completion.

Exact tokens: the context of turn k+1 is the prompt's ids, then every token the engine sampled, then the ids the
environment's answers were rendered to; nothing is decoded and encoded again, so the learner trains on exactly
the tokens the engine produced (``loss_mask`` marks the policy's). The environment's tokens: with a chat
template, the template's rendering of a new message after an assistant turn, less what the template puts before
it; raw, the observation's own ids.

Each episode's environment runs in a process of its own (rlgen.engines.envproc); its calls are made from a pool
of ``task.env_workers`` threads, each waiting at most ``task.env_timeout_s`` for the answer. An environment that
raises or answers with something that is not a Step ends its episode with reward 0 and the reason in
``Completion.env_error``; one that takes longer is killed, and its episode ends the same way, marked
``env_timed_out``, while its thread takes the next call. Seeds: turn 1 is the request itself (its n samples);
later turns draw with seeds derived from the request's, so the same requests give the same episodes (an engine
restarted mid-step, a resumed run) when the environment is deterministic given its seed.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from rlgen.engines.envproc import EnvCallError, EnvProcess
from rlgen.generated import GenResult
from rlgen.tasks.base import Prompt
from rlgen.tasks.envs import Opening, Step
from rlgen.types import Completion, GenRequest, Phase

log = logging.getLogger(__name__)
TURN_SEED_STRIDE = 1_000_033  # turn k's seed: the request's plus k strides


@dataclass(frozen=True)
class EpisodeSpec:
    """What an engine needs to play a request's samples as episodes (picklable: it travels with the request)."""

    env: str
    env_args: dict[str, Any]
    prompt: Prompt
    chat: bool  # the prompt was rendered with the chat template: so are the environment's answers
    max_turns: int = 4
    max_total_tokens: int = 256
    env_timeout_s: float = 30.0
    env_workers: int = 16
    max_prompt_tokens: int = 0  # an environment's own opening may be this long at most (0: no bound)


@dataclass
class _Episode:
    request: GenRequest
    sample: int
    env: EnvProcess
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)
    version: int | None = None
    changes: list[tuple[int, int]] = field(default_factory=list)
    reward: float = 0.0
    turns: int = 0
    error: str = ""
    timed_out: bool = False  # an environment call ran past task.env_timeout_s
    prompt: list[int] | None = None  # the environment's own opening (Opening), rendered; None: the request's
    finish: str = ""  # "" while it goes on; then "stop" (the environment said done) or "length"

    @property
    def spec(self) -> EpisodeSpec:
        return self.request.episode


class TurnTokens:
    """The environment's answer as the token ids that follow the policy's turn in the context."""

    def __init__(self, tokenizer: Any, chat: bool):
        self.tok, self.chat = tokenizer, chat
        self.eos = tokenizer.eos_token_id
        if chat:
            base = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]
            before = self._render(base, False)
            after = self._render([*base, {"role": "user", "content": "\x00"}], True)
            if after[: len(before)] != before:
                raise ValueError("the chat template renders an assistant turn differently once a message follows "
                                 "it; the environment's answers cannot be appended as tokens")
            self.glue = self._after_end(before)  # what the template puts after the assistant's end token
            self.prefix_len = len(before)

    def _render(self, messages: list[dict], generation_prompt: bool) -> list[int]:
        out = self.tok.apply_chat_template(messages, add_generation_prompt=generation_prompt, tokenize=True)
        return [int(i) for i in (out["input_ids"] if hasattr(out, "keys") else out)]

    def _after_end(self, ids: list[int]) -> list[int]:
        ends = [k for k, t in enumerate(ids) if t == self.eos]
        return ids[ends[-1] + 1 :] if ends else []

    @staticmethod
    def _raw(messages: list[dict[str, Any]]) -> str:
        return "".join(f"<tool_response>{m.get('content') or ''}</tool_response>" if m.get("role") == "tool" else
                       str(m.get("content") or "") for m in messages)

    def opening(self, opening: Opening) -> list[int]:
        """An environment's own first messages as the episode's prompt (raw: their contents, one after another)."""
        if not self.chat:
            return list(self.tok.encode(self._raw(opening.messages), add_special_tokens=False))
        out = self.tok.apply_chat_template(opening.messages, add_generation_prompt=True, tokenize=True,
                                           **({"tools": opening.tools} if opening.tools else {}))
        return [int(i) for i in (out["input_ids"] if hasattr(out, "keys") else out)]

    def ids(self, observation: str | list[dict[str, Any]], policy_ended: bool, role: str = "user") -> list[int]:
        """The tokens after a policy turn (which ended on an end-of-sequence token or not) and before the next:
        the observation as a message of ``role`` ("user", or "tool" for a tool's result), or chat messages."""
        messages = observation if isinstance(observation, list) else [{"role": role, "content": observation}]
        if not self.chat:
            return list(self.tok.encode(self._raw(messages), add_special_tokens=False))
        base = [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}]
        whole = self._render([*base, *messages], True)
        head = [] if policy_ended or self.eos is None else [self.eos]
        return head + self.glue + whole[self.prefix_len :]


_TOKENIZERS: dict[str, Any] = {}
_LOCK = threading.Lock()


def _tokenizer(path: str) -> Any:
    with _LOCK:
        if path not in _TOKENIZERS:
            from transformers import AutoTokenizer

            _TOKENIZERS[path] = AutoTokenizer.from_pretrained(path)
        return _TOKENIZERS[path]


class _Activity:
    """What the engine is doing through a call, as spans: ``generate`` while any turn is being generated, ``env``
    while none is and episodes wait for their environment (the engine idles on them)."""

    def __init__(self) -> None:
        self.lock, self.generating, self.waiting = threading.Lock(), 0, 0
        self.state: str | None = None
        self.mark, self.spans = time.time(), []

    def add(self, generating: int = 0, waiting: int = 0) -> None:
        with self.lock:
            self.generating += generating
            self.waiting += waiting
            now = time.time()
            state = Phase.generate.value if self.generating else Phase.env.value if self.waiting else None
            if state != self.state:
                if self.state is not None and now > self.mark:
                    self.spans.append((self.state, self.mark, now))
                self.state, self.mark = state, now

    def close(self) -> None:
        """The call is over: the last span ends now."""
        with self.lock:
            self.generating = self.waiting = 0
        self.add()

    def env_s(self) -> float:
        return sum(b - a for phase, a, b in self.spans if phase == Phase.env.value)


class Episodes:
    """Plays the episode requests of one generate() call; ``turn(requests)`` is the engine's own single-turn
    generate (a list of GenRequests without episodes -> its GenResult).

    ``in_turns`` (an engine that draws a whole batch from one seed, the hf engine): every episode still going
    takes its next turn in one batch, then their environment steps run side by side; the batches are the same
    on every run, so the same seeds give the same episodes. Otherwise (vLLM's per-request seeds) each episode
    plays on its own, as a coroutine: its turns go to the engine as they come, beside other episodes' turns and
    environment calls, so the engine generates whenever any episode has a turn to take. An engine with an event
    loop of its own awaits ``play(its async generate)`` there; ``run()`` plays them on a loop of its own, each
    turn a call of ``turn`` from a worker thread."""

    def __init__(self, turn: Any, requests: list[GenRequest], tokenizer: Any, in_turns: bool):
        self.turn, self.requests, self.in_turns = turn, requests, in_turns
        spec = requests[0].episode
        self.tokens = TurnTokens(tokenizer, spec.chat)
        self.decode = self.tokens.tok.decode
        self.pool = ThreadPoolExecutor(max_workers=max(1, spec.env_workers), thread_name_prefix="env")
        self.activity = _Activity()

    @property
    def spans(self) -> list[tuple[str, float, float]]:
        return self.activity.spans

    def run(self) -> tuple[list[Completion], float]:
        """The episodes' completions (n per request, in request order) and the seconds the engine waited on
        environment calls with nothing to generate; ``spans`` then holds what it was doing when. Alone (not
        ``in_turns``), ``turn`` is called from worker threads, one turn at a time per episode."""
        if not self.in_turns:
            return asyncio.run(self.play(lambda reqs: asyncio.to_thread(self.turn, reqs)))
        episodes = self._episodes()
        try:
            self._together(episodes)
        finally:
            self._close(episodes)
        return [self._completion(e) for e in episodes], self.activity.env_s()

    async def play(self, turn: Any) -> tuple[list[Completion], float]:
        """Alone: every episode a coroutine on the running loop, ``turn(requests)`` a coroutine function (an
        engine's own asynchronous generate); what run() returns."""
        episodes = self._episodes()
        try:
            await asyncio.gather(*(self._play(e, turn) for e in episodes))
        finally:
            self._close(episodes)
        return [self._completion(e) for e in episodes], self.activity.env_s()

    def _episodes(self) -> list[_Episode]:
        return [_Episode(r, j, EnvProcess(r.episode.env, dict(r.episode.env_args))) for r in self.requests
                for j in range(r.sampling.n)]

    def _close(self, episodes: list[_Episode]) -> None:
        self.activity.close()
        self.pool.shutdown(wait=False, cancel_futures=True)  # every call in it ends within its timeout
        for e in episodes:  # the environment's close() runs (an agent's thread ends); its process plays a later one
            with contextlib.suppress(Exception):
                e.env.close()

    def _together(self, episodes: list[_Episode]) -> None:
        self._reset(episodes)
        turn = 0
        while going := [e for e in episodes if not e.finish]:
            turn += 1
            self._generate(going, turn)
            if going := [e for e in going if not e.finish]:
                self._step(going)

    async def _play(self, e: _Episode, turn_fn: Any) -> None:
        await self._env_call(e, self._open, self._opened)
        turn = 0
        while not e.finish:
            turn += 1
            self.activity.add(generating=1)
            try:
                out = await turn_fn(self._turn_requests([e], turn))
            finally:
                self.activity.add(generating=-1)
            self._take(list(zip([e], out.completions)))
            if not e.finish:
                await self._env_call(e, self._act, self._stepped)

    # -- the environment's side -------------------------------------------------------------------------
    # The pool's threads make the environment's calls (each in its episode's process, bounded by its timeout); what
    # they return is applied by the coroutine that awaited it.
    def _open(self, e: _Episode) -> Any:
        spec = e.spec
        seed = (e.request.sampling.seed or 0) * 1_009 + e.request.group_id * 101 + e.sample
        return e.env.reset(spec.prompt, seed, spec.env_timeout_s)

    def _opened(self, e: _Episode, opening: Any) -> None:
        if isinstance(opening, Opening):
            e.prompt = self.tokens.opening(opening)
            if e.spec.max_prompt_tokens and len(e.prompt) > e.spec.max_prompt_tokens:
                raise ValueError(f"the opening messages are {len(e.prompt)} tokens, more than task.max_prompt_tokens="
                                 f"{e.spec.max_prompt_tokens}")

    def _reset(self, episodes: list[_Episode]) -> None:
        self._env_calls(episodes, self._open, self._opened)

    def _step(self, episodes: list[_Episode]) -> None:
        self._env_calls(episodes, self._act, self._stepped)

    def _act(self, e: _Episode) -> tuple[Any, list[int] | None]:
        """In a pool thread: the policy's last turn to the environment, and its answer's tokens (None when there are
        none to add); nothing here changes the episode."""
        action = self.decode(e.tokens[self._turn_start(e):], skip_special_tokens=True)
        step = e.env.step(action, e.spec.env_timeout_s)
        if not isinstance(step, Step) or step.done or not step.observation:
            return step, None
        ended = bool(e.tokens) and e.tokens[-1] in self._stops(e)
        return step, self.tokens.ids(step.observation, ended, step.role)

    def _stepped(self, e: _Episode, out: tuple[Any, list[int] | None]) -> None:
        step, ids = out
        if not isinstance(step, Step):
            raise TypeError(f"step() returned {type(step).__name__}, not rlgen.tasks.envs.Step")
        e.reward += float(step.reward)
        spec = e.spec
        if step.done:
            e.finish = "stop"
        elif not step.observation or ids is None:
            raise ValueError("step() returned no observation and done=False")
        elif e.turns >= spec.max_turns or len(e.tokens) + len(ids) >= spec.max_total_tokens:
            e.finish = "length"
        else:
            e.tokens += ids
            e.logprobs += [0.0] * len(ids)
            e.mask += [0] * len(ids)

    async def _env_call(self, e: _Episode, work: Any, apply: Any) -> None:
        """work(e) in the pool, then apply(e, its result) on the running loop, unless it raised or ran past
        task.env_timeout_s (counted from when the call reached the episode's process, not while it waited for a
        thread): then the episode fails. The thread's every wait is bounded, so this await is too."""
        self.activity.add(waiting=1)
        try:
            out = await asyncio.get_running_loop().run_in_executor(self.pool, work, e)
            apply(e, out)
        except TimeoutError as err:
            self._fail(e, str(err), timed_out=True)
        except EnvCallError as err:
            self._fail(e, f"the environment raised {err.kind}: {err}")
        except Exception as err:  # noqa: BLE001 - any failure of the environment ends that episode only
            self._fail(e, f"the environment raised {type(err).__name__}: {err}")
        finally:
            self.activity.add(waiting=-1)

    def _env_calls(self, episodes: list[_Episode], work: Any, apply: Any) -> None:
        """work(episode) for each, side by side in the pool, then apply(episode, its result) here; each call's
        timeout counts from when it starts (not while it waits for a free thread)."""

        async def each() -> None:
            await asyncio.gather(*(self._env_call(e, work, apply) for e in episodes))

        asyncio.run(each())

    @staticmethod
    def _fail(e: _Episode, why: str, timed_out: bool = False) -> None:
        """The episode ends here with reward 0, whatever its steps scored before: it was not played to its end."""
        e.error, e.reward, e.finish, e.timed_out = why[:300], 0.0, "stop", timed_out
        if timed_out:
            e.env.kill()

    # -- the engine's side ------------------------------------------------------------------------------
    @staticmethod
    def _stops(e: _Episode) -> set[int]:
        return set(e.request.sampling.stop_token_ids)

    @staticmethod
    def _turn_start(e: _Episode) -> int:
        """Where the policy's last turn began in e.tokens."""
        k = len(e.mask)
        while k > 0 and e.mask[k - 1] == 1:
            k -= 1
        return k

    def _generate(self, episodes: list[_Episode], turn: int) -> None:
        self.activity.add(generating=1)
        try:
            self._turn(episodes, turn)
        finally:
            self.activity.add(generating=-1)

    def _turn(self, episodes: list[_Episode], turn: int) -> None:
        if turn == 1 and self.in_turns and not any(e.prompt for e in episodes):  # the requests: n samples each
            reqs = [dataclasses.replace(r, episode=None) for r in self.requests]
            out = self.turn(reqs)
            by_request: dict[int, list[Completion]] = {}
            pos = 0
            for i, r in enumerate(self.requests):
                by_request[i] = out.completions[pos : pos + r.sampling.n]
                pos += r.sampling.n
            index = {id(r): i for i, r in enumerate(self.requests)}
            self._take([(e, by_request[index[id(e.request)]][e.sample]) for e in episodes])
        else:
            out = self.turn(self._turn_requests(episodes, turn))
            self._take(list(zip(episodes, out.completions)))

    def _turn_requests(self, episodes: list[_Episode], turn: int) -> list[GenRequest]:
        """Each episode's next turn as a request of one sample: its context so far, the tokens left to it, and a
        seed of its own (alone, turn 1 too)."""
        reqs = []
        for e in episodes:
            s = e.request.sampling
            seed = None if s.seed is None else s.seed + turn * TURN_SEED_STRIDE + (0 if self.in_turns else
                                                                                    e.sample * 7_919)
            left = e.spec.max_total_tokens - len(e.tokens)
            sampling = dataclasses.replace(s, n=1, seed=seed, max_new_tokens=max(1, min(s.max_new_tokens, left)))
            prompt = e.prompt if e.prompt is not None else e.request.prompt_ids
            reqs.append(GenRequest(tuple(prompt) + tuple(e.tokens), sampling, e.request.group_id, e.request.adapter))
        return reqs

    @staticmethod
    def _take(done: list[tuple[_Episode, Completion]]) -> None:
        """The turns just generated, appended to their episodes."""
        for e, c in done:
            at = len(e.tokens)
            if e.version is None:
                e.version = c.version
            elif c.version != (e.changes[-1][1] if e.changes else e.version):
                e.changes.append((at, c.version))
            e.changes += [(at + k, v) for k, v in c.version_changes]
            e.tokens += c.token_ids
            e.logprobs += c.logprobs
            e.mask += [1] * len(c.token_ids)
            e.turns += 1
            if c.finish_reason == "length" and len(e.tokens) >= e.spec.max_total_tokens:
                e.finish = "length"

    def _completion(self, e: _Episode) -> Completion:
        r = e.request
        if e.error:
            log.info("episode of group %d sample %d: %s", r.group_id, e.sample, e.error)
        return Completion(group_id=r.group_id, prompt_ids=list(e.prompt if e.prompt is not None else r.prompt_ids),
                          token_ids=e.tokens, logprobs=e.logprobs, finish_reason=e.finish or "length",
                          version=e.version if e.version is not None else 0, version_changes=e.changes,
                          loss_mask=e.mask, env_reward=e.reward, turns=e.turns, env_error=e.error,
                          env_timed_out=e.timed_out, own_prompt=e.prompt is not None)


class Episodic:
    """An engine mixin: an engine's generate() begins with ``if is_episodes(requests): return
    self.play_episodes(requests)``, and its own single-turn generate plays each turn. ``one_seed_per_batch``:
    the engine draws a whole batch from one seed (the hf engine), so episodes take their turns together, in the
    same batches every time; else each episode plays on its own and each sample has seeds of its own (vLLM's
    per-request seeds): an engine with an event loop of its own overrides ``_play_episodes`` to await
    ``Episodes.play`` there, else its generate() must take calls from several threads at once."""

    one_seed_per_batch = False

    def play_episodes(self, requests: list[GenRequest]) -> GenResult:
        if any(r.episode is None for r in requests):
            raise ValueError("a generate() call mixes episode requests with single-turn ones")
        tokenizer = _tokenizer(self.model_path)  # the engine's model folder: the environment's answers' tokens
        episodes = Episodes(self.generate, requests, tokenizer, in_turns=self.one_seed_per_batch)
        completions, env_s = self._play_episodes(episodes)
        return GenResult(completions=completions, version=self.version, spans=episodes.spans, env_s=env_s)

    def _play_episodes(self, episodes: Episodes) -> tuple[list[Completion], float]:
        return episodes.run()


def is_episodes(requests: list[GenRequest]) -> bool:
    return bool(requests) and requests[0].episode is not None
