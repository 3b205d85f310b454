"""The engines' side of the loop. Each step's prompts are rendered into requests (a flight), launched over the
engines, and collected; an engine that died is re-created and sent its requests again (same seeds: the same
rollouts). The driver then prepares them: decodes, cuts at stop strings, checks that every prompt has its n
completions, and hands them to the scorer. A flight whose rollouts are in while the learner trains is
prepared then, so scoring overlaps training. Held-out evaluation runs the same way, greedy or pass@k."""

from __future__ import annotations

import logging
import time
from collections import deque
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING

from rlgen.engines.base import engine_died
from rlgen.runtime.cluster.waits import POLL_S, did_not_finish, short
from rlgen.runtime.errors import RunError, StopRequested
from rlgen.runtime.rollouts.engine_restarts import EngineKeeper
from rlgen.runtime.rollouts.in_flight import InFlight, UpdateResult, results_from_json
from rlgen.runtime.rollouts.pace import Pace
from rlgen.tasks.prompts import PromptRenderer, cut_at_stop
from rlgen.tasks.scoring import RewardError, Scorer, finite_mean
from rlgen.types import Completion, GenRequest, Phase, SamplingParams

if TYPE_CHECKING:
    from ray import ObjectRef
    from ray.actor import ActorHandle
    from transformers import PreTrainedTokenizerBase

    from rlgen.config import RunConfig
    from rlgen.engines.episodes import EpisodeSpec
    from rlgen.generated import GenResult
    from rlgen.runtime.rollouts.batch import StepPrompts
    from rlgen.runtime.rollouts.carry import Carried
    from rlgen.runtime.signals import StopFlag
    from rlgen.sync.transports.base import WeightTransport
    from rlgen.tasks.base import Prompt, Task
    from rlgen.types import JSONDict

log = logging.getLogger(__name__)
EVAL_SEED_OFFSET = 7_919_000  # eval sampling seeds, apart from every training step's
REFILL_SEED_STRIDE = 15_485_863  # dynamic sampling's round r of a step: seeds r strides from the step's own


def episode_specs(cfg: RunConfig, renderer: PromptRenderer) -> Callable[[Prompt], EpisodeSpec] | None:
    """For a multi-turn task (task.kind=env): prompt -> the EpisodeSpec each of its samples plays; else None."""
    from rlgen.config import TaskKind

    t = cfg.task
    if t.kind != TaskKind.env:
        return None
    from rlgen.engines.episodes import EpisodeSpec

    def spec(prompt: Prompt) -> EpisodeSpec:
        return EpisodeSpec(env=t.env, env_args=dict(t.env_args), prompt=prompt, chat=renderer.chat,
                           max_turns=t.max_turns, max_total_tokens=t.max_total_tokens, env_timeout_s=t.env_timeout_s,
                           env_workers=t.env_workers, max_prompt_tokens=t.max_prompt_tokens)

    return spec


def _failed(ref: ObjectRef) -> bool:
    """Whether a finished call raised."""
    import ray

    try:
        ray.get(ref, timeout=0)
    except Exception:  # noqa: BLE001 - any failure: the caller leaves it to the step that needs the result
        return True
    return False


class Rollouts:
    """The flights launched and not yet taken by a step, oldest first, and the weight updates queued for the next
    flight launched."""

    def __init__(self, cfg: RunConfig, task: Task, tokenizer: PreTrainedTokenizerBase, renderer: PromptRenderer,
                 stop_ids: list[int], keeper: EngineKeeper, scorer: Scorer, stop: StopFlag):
        self.cfg, self.task, self.tokenizer, self.renderer = cfg, task, tokenizer, renderer
        self.stop_ids, self.keeper, self.scorer, self.stop = stop_ids, keeper, scorer, stop
        self.transport: WeightTransport | None = None  # the run's (runtime.setup sets it): generate_at, after a death
        self._pending: deque[InFlight] = deque()
        # engine index -> (incarnation, update ref) in the object store: applied before each engine's next generate
        self._queued_updates: dict[int, tuple[int, ObjectRef[UpdateResult]]] = {}
        self.next_gen = 0  # the next step to launch generation for
        self._collected = 0  # flights collected by this process (the first one generates alone)
        self.eval_set = self._eval_prompts()
        self.episode = episode_specs(cfg, renderer)  # a multi-turn task: prompt -> the EpisodeSpec its samples play
        self.said_env_error = False  # an environment's first error is named on the console once
        self.said_env_timeouts = False  # and the first step its timeouts made long
        self.carry: list[Carried] = []  # algo.partial_rollouts: groups cut short, for the next flight launched
        self.pace = Pace()  # when a flight ahead of the learner goes out (rlgen.runtime.rollouts.pace)

    @property
    def engines(self) -> list[ActorHandle]:
        return self.keeper.engines

    # -- flights ----------------------------------------------------------------------------------------
    @property
    def collected(self) -> int:  # flights taken by steps in this process (the first one generates alone)
        return self._collected

    def waiting(self) -> list[InFlight]:
        """The flights launched and not yet taken by a step, oldest first."""
        return list(self._pending)

    def next_flight(self, launch: Callable[[], float | None] | None = None) -> InFlight:
        """The oldest flight, collected (an engine that died meanwhile is re-created), and taken off the queue;
        launch: called while it is waited for, to send the flights ahead whose time has come (see fill)."""
        flight = self._pending[0]
        self.collect(flight, launch=launch)
        self._pending.popleft()
        self._collected += 1
        now = time.time()
        ends = [b for r in flight.results.values() for phase, _, b in r.spans if phase == Phase.generate.value]
        self.pace.collected(flight.launched_at, min(max(ends), now) if ends else now, now)
        return flight

    def put_back(self, flight: InFlight) -> None:
        """A flight whose step did not finish, back at the front of the queue (a checkpoint keeps its rollouts)."""
        self._pending.appendleft(flight)

    def ahead(self) -> InFlight | None:
        """The oldest flight still waiting (the one after the step's own, once it was taken), or None."""
        return self._pending[0] if self._pending else None

    def queue_updates(self, refs_by_engine: Sequence[ObjectRef[UpdateResult]]) -> None:
        """A weight update's refs, one per engine in order: each is waited for before its engine's next generate
        is collected, in place of any queued before."""
        self._queued_updates = {i: (self.keeper.incarnation[i], ref) for i, ref in enumerate(refs_by_engine)}

    def take_queued_updates(self) -> dict[int, tuple[int, ObjectRef[UpdateResult]]]:
        """The queued updates (engine index -> (incarnation, ref)), taken off the queue: the caller waits for them."""
        queued, self._queued_updates = self._queued_updates, {}
        return queued

    def new_flight(self, step: int, launch_version: int, carried: list[Carried] | None = None,
                   extra: int | None = None, async_steps: int = 0) -> InFlight:
        """Step's flight. With algo.partial_rollouts it also holds the groups that the flights up to step -
        async_steps - 1 cut short (carried: those, in place of the ones waiting; so what a flight holds does not
        depend on when the flight before it was collected) and extra prompts to fill it, and may end once the step's
        groups are done."""
        from rlgen.runtime.rollouts.batch import encode_prompts, sampling_params, split_requests

        sp = encode_prompts(step, self.task, self.renderer, self.cfg)
        sampling = sampling_params(self.cfg, self.stop_ids, seed=self.cfg.seed * 100_003 + step)
        if not self.cfg.algo.partial_rollouts:
            return InFlight(step, sp, split_requests(sp, sampling, len(self.engines), self.episode), launch_version)
        if carried is None:
            ready = step - async_steps - 1
            carried = [c for c in self.carry if c.source <= ready]
            self.carry = [c for c in self.carry if c.source > ready]
        return self._partial_flight(step, launch_version, sp, sampling, carried, extra)

    def _partial_flight(self, step: int, version: int, sp: StepPrompts, sampling: SamplingParams,
                        carried: list[Carried], extra: int | None) -> InFlight:
        from rlgen.runtime.rollouts.batch import StepPrompts, split_requests
        from rlgen.runtime.rollouts.carry import (
            PARTIAL_ROUND,
            continuations,
            extra_groups,
            oldest_first,
            quotas,
        )

        a = self.cfg.algo
        sp = StepPrompts(sp.step, list(sp.prompts), list(sp.prompt_ids))
        extra = extra_groups(a.prompts_per_step, a.partial_rollouts, len(carried)) if extra is None else extra
        if extra:
            added = self._extra_prompts(step, PARTIAL_ROUND, extra, "algo.partial_rollouts",
                                        "set algo.partial_rollouts=0")
            sp.prompts += added.prompts
            sp.prompt_ids += added.prompt_ids
        own = split_requests(sp, sampling, len(self.engines))
        groups = [len(reqs) for reqs in own]
        # the carried groups' continuations go first, the oldest first: an engine works through its requests in
        # order and may end the call before it starts the last ones, so a group carried always gets on
        first: list[list[GenRequest]] = [[] for _ in own]
        by_gid = {}
        for c in oldest_first(carried):
            gid = len(sp.prompts)
            sp.prompts.append(c.prompt)
            sp.prompt_ids.append(list(c.prompt_ids))
            first[gid % len(own)] += continuations(c, gid, sampling, a.partial_max_steps)
            groups[gid % len(own)] += 1
            by_gid[gid] = c
        shards = [ahead + reqs for ahead, reqs in zip(first, own)]
        return InFlight(step, sp, shards, version, enough=quotas(groups, a.prompts_per_step), carried=by_gid,
                        extra=extra)

    def _extra_prompts(self, step: int, round: int, n: int, setting: str, off: str) -> StepPrompts:
        """n more prompts of the task for round `round` of a step, encoded; a task that gives none is refused in
        one sentence naming the setting that asked for them and how to turn it off."""
        from rlgen.runtime.rollouts.batch import encode_prompts

        more = getattr(self.task, "extra_prompts", None)
        if more is None:
            raise RunError(f"{setting} needs more prompts than each step's, but task {self.task.name} gives no "
                           f"extra_prompts(step, round, n); {off} for it.")
        return encode_prompts(step, self.task, self.renderer, self.cfg, prompts=more(step, round, n))

    def extra_flight(self, step: int, round: int, n: int, version: int) -> InFlight:
        """Generation round `round` >= 1 of a step (dynamic sampling): n more prompts of the task, their own
        seeds, launched now."""
        from rlgen.runtime.rollouts.batch import sampling_params, split_requests

        sp = self._extra_prompts(step, round, n, "algo.dynamic_sampling", "turn algo.dynamic_sampling off")
        seed = self.cfg.seed * 100_003 + step + round * REFILL_SEED_STRIDE
        sampling = sampling_params(self.cfg, self.stop_ids, seed=seed)
        return self._send(InFlight(step, sp, split_requests(sp, sampling, len(self.engines), self.episode), version))

    def _send(self, flight: InFlight) -> InFlight:
        flight.launched_at = time.time()
        for i, reqs in enumerate(flight.shards):
            if reqs:
                flight.refs[i] = (self.keeper.incarnation[i], flight.call(self.engines[i], i))
        return flight

    def fill(self, step: int, async_steps: int, version: int, paced: bool = False) -> float | None:
        """Launch every step up to step + async_steps (weights queued since the last launch go first). paced: a
        flight ahead of the step's own waits for its time (rlgen.runtime.rollouts.pace); returns the seconds until
        the next one is due (None: none waits)."""
        while self.next_gen < self.cfg.steps and self.next_gen <= step + async_steps:
            wait = self.pace.wait_s(async_steps, time.time()) if paced and self.next_gen > step else 0.0
            if wait > 0:
                return wait
            flight = self._send(self.new_flight(self.next_gen, version, async_steps=async_steps))
            self.pace.launched(flight.launched_at)
            flight.updates = self.take_queued_updates()
            self._pending.append(flight)
            self.next_gen += 1
        return None

    def restore(self, saved: Sequence[JSONDict], next_step: int, carry: Sequence[JSONDict] = ()) -> None:
        """Flights a checkpoint kept (generated ahead of the learner) with their results, and the groups it had
        cut short and not yet sent on (algo.partial_rollouts)."""
        from rlgen.runtime.rollouts.carry import Carried

        self.carry = [Carried.from_json(c) for c in carry]
        for data in saved:
            carried = [Carried.from_json(c) for _, c in sorted(data.get("carried", {}).items(), key=lambda x: int(x[0]))]
            flight = self.new_flight(int(data["step"]), int(data["launch_version"]), carried, data.get("extra"))
            flight.results = results_from_json(data)
            self._pending.append(flight)
        self.next_gen = self._pending[-1].step + 1 if self._pending else next_step

    def carry_to_save(self, kept: list[InFlight]) -> list[JSONDict]:
        """The groups cut short that a checkpoint keeps apart from its flights (kept: the flights it saves): those
        the flights it does not save were carrying (those are generated again on resume, and carry them again),
        then those waiting, less the ones the pending flights cut short (they cut them again on resume)."""
        saved = {f.step for f in kept}
        again = [c for f in self._pending if f.step not in saved for c in f.carried.values()]
        pending = {f.step for f in self._pending}
        return [c.to_json() for c in again + [c for c in self.carry if c.source not in pending]]

    def collect(self, flight: InFlight, *, interruptible: bool = True,
                launch: Callable[[], float | None] | None = None) -> None:
        """Wait for a flight's results. An engine that died is re-created and its requests are sent again; a
        stop request raises StopRequested. launch: called as the wait goes on, to send flights whose time has come;
        it returns the seconds until the next is due (None: none is held)."""
        import ray
        from ray.exceptions import RayActorError, RayTaskError

        what = f"generation for step {flight.step}"
        timeout = self.cfg.timeout_s
        deadline = time.time() + timeout
        while flight.refs:
            if interruptible and self.stop.requested:
                raise StopRequested(what)
            due = launch() if launch is not None else None
            left = deadline - time.time()
            if left <= 0:
                raise RunError(did_not_finish(what, "timeout_s", timeout, flight.env_bound()))
            wait = min(POLL_S, left, due) if due is not None else min(POLL_S, left)
            ready, _ = ray.wait([ref for _, ref in flight.refs.values()], num_returns=1, timeout=wait)
            for i, (inc, ref) in list(flight.refs.items()):
                if ref not in ready:
                    continue
                try:
                    flight.results[i] = ray.get(ref)
                    del flight.refs[i]
                except (RayActorError, RayTaskError) as err:
                    if not engine_died(err):  # the engine raised: the run cannot go on
                        name = self.keeper.names[i]
                        log.info("%s raised in %s", what, name, exc_info=err)
                        raise RunError(f"{what}: {name} raised {short(err.cause)}") from err
                    # its actor, or the engine inside it, is gone: a new one gets the same requests and seeds
                    self.keeper.is_dead(i, inc, err)
                    flight.refs[i] = (self.keeper.incarnation[i], self._generate_again(i, flight))
                    deadline = time.time() + timeout
        for i, (inc, ref) in list(flight.updates.items()):  # weights queued before this generate (object store)
            try:
                flight.update_spans[i] = ray.get(ref, timeout=timeout).get("spans", [])
            except (RayActorError, RayTaskError) as err:
                if not engine_died(err):
                    raise RunError(f"a weight update of {self.keeper.names[i]} failed: {short(err)}") from err
                self.keeper.is_dead(i, inc, err)  # the re-created engine got the current weights already
            del flight.updates[i]
        if flight.enough is not None and flight.resolved is None:
            self._resolve(flight)

    def _resolve(self, flight: InFlight) -> None:
        """algo.partial_rollouts: the flight's groups that are done are its completions; those cut short wait for
        the next flight launched."""
        from rlgen.runtime.rollouts.carry import resolve

        try:
            flight.resolved = resolve(flight.step, flight.prompts.prompts, flight.prompts.prompt_ids, flight.carried,
                                      flight.completions())  # the engines' (not yet sorted out)
        except ValueError as err:
            raise RunError(str(err)) from err
        self.carry.extend(flight.resolved.cut)

    def _generate_again(self, i: int, flight: InFlight) -> ObjectRef[GenResult]:
        """Engine i's requests of ``flight`` sent to its re-created actor, at the weights the flight was launched
        with where the transport keeps those (a flight launched ahead of the learner); the later versions it then
        takes again are queued before its next generate, as a push's are."""

        def generate() -> ObjectRef[GenResult]:
            return flight.call(self.engines[i], i)

        if self.transport is None:
            return generate()
        ref, updates = self.transport.generate_at(i, flight.launch_version, generate)
        if updates:
            self._queued_updates[i] = (self.keeper.incarnation[i], updates[-1])
        return ref

    # -- on the driver ------------------------------------------------------------------------------------
    def prepare(self, flight: InFlight) -> None:
        """Decode, cut at stop strings, check, and hand the completions to the scorer (once per flight)."""
        if flight.scoring is not None:
            return
        from rlgen.runtime.rollouts.batch import RolloutCountError, check_complete

        comps, texts = self._decoded(flight)
        sp = flight.trained()
        try:
            check_complete(comps, sp, flight.samples)
        except RolloutCountError as err:
            raise RunError(str(err)) from err
        prompts = [sp.prompts[c.group_id] for c in comps]
        where = [p.source or f"prompt {c.group_id} ({p.text[:40]!r})" for c, p in zip(comps, prompts)]
        flight.prepared = comps
        if self.episode is not None:  # the environments scored the episodes
            flight.scoring = self.scorer.given([c.env_reward or 0.0 for c in comps], where, flight.step)
        else:
            flight.scoring = self.scorer.submit(texts, [p.answer for p in prompts], where, flight.step)

    def _decoded(self, flight: InFlight) -> tuple[list[Completion], list[str]]:
        comps = flight.completions()
        texts = self.tokenizer.batch_decode([c.token_ids for c in comps], skip_special_tokens=True)
        if self.cfg.task.stop and self.episode is None:
            pairs = [cut_at_stop(c, self.tokenizer, list(self.cfg.task.stop), t) for c, t in zip(comps, texts)]
            comps, texts = [p[0] for p in pairs], [p[1] for p in pairs]
        return comps, texts

    def prefetch(self) -> None:
        """While the learner trains: prepare the next flight if all its rollouts are in (its rewards then score
        in the pool meanwhile). Anything that goes wrong is left for the step that needs the flight."""
        import ray

        if not self._pending or self._pending[0].scoring is not None:
            flight = None
        else:
            flight = self._pending[0]
        if flight is None:
            return
        refs = [ref for _, ref in flight.refs.values()] + [ref for _, ref in flight.updates.values()]
        if refs and len(ray.wait(refs, num_returns=len(refs), timeout=0)[0]) < len(refs):
            return
        if any(_failed(ref) for ref in refs):  # an engine died: re-created once the learner is done (its weights
            return                             # are read then, and the version they are labelled with is theirs)

        try:
            self.collect(flight, interruptible=False)
            self.prepare(flight)
        except (RunError, StopRequested, RewardError) as err:
            log.info("prefetching step %d's rollouts: %s", flight.step, err)

    # -- held-out evaluation ----------------------------------------------------------------------------
    def _eval_prompts(self) -> list[Prompt]:
        e = self.cfg.eval
        if e.every <= 0:
            return []
        prompts = self.task.eval_prompts()
        return prompts[: e.max_prompts] if e.max_prompts > 0 else prompts

    def evaluate(self, step: int, version: int) -> dict[str, float]:
        """The held-out prompts, greedy (eval.samples=1) or eval.samples at eval.temperature: pass@k of the first
        reward (a prompt passes when one of its samples scores 1) and the mean reward."""
        from rlgen.runtime.rollouts.batch import StepPrompts, split_requests

        if not self.eval_set:
            return {}
        t0 = time.time()
        e = self.cfg.eval
        rendered = [(p, self.renderer.fit(self.renderer.ids(p.text))) for p in self.eval_set]
        kept = [(p, ids) for p, ids in rendered if ids]
        sp = StepPrompts(step, [p for p, _ in kept], [ids for _, ids in kept])
        sampling = SamplingParams(n=e.samples, temperature=0.0 if e.samples == 1 else e.temperature, top_p=1.0,
                                  max_new_tokens=self.cfg.algo.max_new_tokens, stop_token_ids=tuple(self.stop_ids),
                                  seed=self.cfg.seed * 100_003 + EVAL_SEED_OFFSET + step)

        flight = self._send(InFlight(step, sp, split_requests(sp, sampling, len(self.engines), self.episode),
                                     version))
        self.collect(flight)
        try:
            self.prepare(flight)
            scores = self.scorer.result(flight.scoring)
        except RewardError as err:
            raise RunError(f"held-out evaluation: {err}") from err
        first = self.scorer.rewards.names[0]
        passed: dict[int, bool] = {}
        for c, value in zip(flight.prepared, scores.parts[first]):
            passed[c.group_id] = passed.get(c.group_id, False) or value >= 1.0
        return {
            f"eval/pass@{e.samples}": sum(passed.values()) / max(len(passed), 1),
            "eval/reward_mean": finite_mean(scores.totals),
            "eval/prompts": float(len(passed)),
            "eval_s": time.time() - t0,
        }

    def close(self) -> None:
        self.scorer.close()
