"""Plan -> Ray actors -> the GRPO loop. Reads top to bottom: setup(), train(), cleanup().

One step: engines generate the step's rollouts (policy version v), the driver scores them, the learner trains
(v -> v+1), and the new weights go to the engines. Up to ``async_steps`` generations run ahead of the learner,
so generation of step s+1 overlaps training of step s; ``async_steps=0`` is strictly on-policy.
"""

from __future__ import annotations

import os
import re
import time
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rich.markup import escape

from rlgen.config import BreakerAction, RunConfig
from rlgen.monitor import CircuitBreaker
from rlgen.plan import Plan
from rlgen.sync import SyncError, make_transport
from rlgen.types import Phase, StepTimeline

QUIET_ENV = {"HF_HUB_DISABLE_PROGRESS_BARS": "1", "TRANSFORMERS_VERBOSITY": "error", "TOKENIZERS_PARALLELISM": "false"}


class RunError(RuntimeError):
    """The run cannot go on; the message says why and what to do."""


def actor_death_detail(err: BaseException, limit: int = 1500) -> str:
    """What killed an actor: the first line of Ray's message and, for an actor whose constructor raised, the
    exception it raised (the last lines of the creation task's traceback)."""
    lines = [ln for ln in re.sub(r"\x1b\[[0-9;]*m", "", str(err)).splitlines() if ln.strip()]
    if not lines:
        return type(err).__name__
    head = lines[0][:300]
    frames = [i for i, ln in enumerate(lines) if ln.lstrip().startswith('File "')]
    start = frames[-1] + 2 if frames else 1  # past the last frame and its source line: the exception itself
    tail = [ln.strip() for ln in lines[start:]][:4]
    return (head + (": " + " | ".join(tail) if tail else ""))[:limit]


@dataclass
class InFlight:
    step: int
    refs: list[Any]  # one generate() ref per engine
    updates: list[Any] = field(default_factory=list)  # update_weights() refs queued before this generate


class Orchestrator:
    def __init__(
        self,
        cfg: RunConfig,
        plan: Plan,
        out_dir: Path,
        *,
        engine_cls: type | None = None,
        engine_kwargs: dict[str, Any] | None = None,
        learner_cls: type | None = None,
    ):
        """engine_cls (with engine_kwargs) and learner_cls replace the classes the plan picks; tests inject
        faults with them (rlgen.engines.noisy.NoisyEngine, a learner that poisons its gradients)."""
        self.cfg, self.plan, self.out_dir = cfg, plan, Path(out_dir)
        self._engine_cls, self._engine_kwargs, self._learner_cls = engine_cls, dict(engine_kwargs or {}), learner_cls
        self.breaker = CircuitBreaker(cfg.monitor, self.out_dir)
        self.engines: list[Any] = []
        self.engine_names: list[str] = []
        self.learner: Any = None  # rank 0: speaks for the learner group (weights, saving)
        self.learners: list[Any] = []  # every rank, rank 0 first
        self.pgs: list[Any] = []
        self._started_ray = False
        self.async_steps = cfg.algo.async_steps
        self.transport: Any = None

    # -- setup ------------------------------------------------------------------------------------------
    def setup(self) -> None:
        import ray
        from ray.util.placement_group import placement_group
        from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

        from rlgen.models import load_tokenizer, prepare_model
        from rlgen.placement import plan_bundles
        from rlgen.tasks import build_task

        cfg, plan = self.cfg, self.plan
        for var, val in QUIET_ENV.items():  # before transformers loads; actors inherit the driver's environment
            os.environ.setdefault(var, val)
        self.task = build_task(cfg.task)
        self.model_path = prepare_model(cfg, device="cuda" if plan.device == "cuda" else "cpu")
        self.tokenizer = load_tokenizer(self.model_path)
        self.eos_ids = [self.tokenizer.eos_token_id] if self.tokenizer.eos_token_id is not None else []
        self.pad_id = self.tokenizer.pad_token_id if self.tokenizer.pad_token_id is not None else 0

        placement = plan_bundles(plan)
        if not ray.is_initialized():
            need_cpus = sum(sum(b.get("CPU", 0) for b in g) for g in placement.groups)
            kwargs: dict[str, Any] = {"include_dashboard": False, "log_to_driver": True}
            if not os.environ.get("RAY_ADDRESS"):
                kwargs["address"] = "local"  # a fresh local cluster, never someone else's by accident
                kwargs["num_cpus"] = int(max(os.cpu_count() or 1, need_cpus + 1))
                kwargs["object_store_memory"] = 512 * 2**20 if plan.device == "cpu" else None
            ray.init(**{k: v for k, v in kwargs.items() if v is not None})
            self._started_ray = True
        self.pgs = [placement_group(list(bundles), strategy="STRICT_PACK") for bundles in placement.groups]
        ready, _ = ray.wait([pg.ready() for pg in self.pgs], num_returns=len(self.pgs), timeout=cfg.startup_timeout_s)
        if len(ready) < len(self.pgs):
            raise RunError(
                f"Ray could not reserve the resources of the plan within startup_timeout_s={cfg.startup_timeout_s:.0f} s "
                f"(bundles: {[list(g) for g in placement.groups]}; cluster has {ray.cluster_resources()}). "
                "Check hardware=<preset> against the machine, or set RAY_ADDRESS to a cluster that has them."
            )

        def strategy(ap):
            return PlacementGroupSchedulingStrategy(self.pgs[ap.group], placement_group_bundle_index=ap.bundle)

        engine_cls, engine_kwargs = self._engine_class()
        device = "cuda" if plan.device == "cuda" else "cpu"
        for slot, ap in zip(plan.engines, placement.engines):
            name = f"engine{slot.index}"
            actor = (
                ray.remote(engine_cls)
                .options(
                    num_cpus=ap.num_cpus,
                    num_gpus=ap.num_gpus,
                    scheduling_strategy=strategy(ap),
                    # vLLM engines are threaded, so pause()/receive_weights() can run during generate().
                    max_concurrency=4 if plan.engine_kind == "vllm" else 1,
                )
                .remote(self.model_path, cfg.engine, device=device, seed=cfg.seed + slot.index, name=name, **engine_kwargs)
            )
            self.engines.append(actor)
            self.engine_names.append(name)
        learner_cls, learner_kwargs = self._learner_class()
        world = len(placement.learners)
        if world > 1:  # rank 0's node and a free port there, for the group's torch.distributed rendezvous
            from rlgen.learners.group import free_endpoint

            ap0 = placement.learners[0]
            where = ray.remote(free_endpoint).options(num_cpus=0, scheduling_strategy=strategy(ap0)).remote()
            addr, port = self._get(where, "finding the learner group's rendezvous", timeout_s=cfg.startup_timeout_s)
            learner_kwargs.update(world_size=world, master_addr=addr, master_port=port)
        for rank, ap in enumerate(placement.learners):
            self.learners.append(
                ray.remote(learner_cls)
                .options(num_cpus=ap.num_cpus, num_gpus=ap.num_gpus, scheduling_strategy=strategy(ap))
                .remote(
                    self.model_path, cfg.algo, cfg.monitor, seed=cfg.seed, device=device, rank=rank,
                    name=f"learner{rank}", **learner_kwargs,
                )
            )
        self.learner = self.learners[0]
        health = self._get(
            [e.health.remote() for e in self.engines] + [a.health.remote() for a in self.learners],
            "actor start-up",
            timeout_s=cfg.startup_timeout_s,
        )
        bad = [h for h in health if not h.get("ok")]
        if bad:
            raise RunError(f"actors reported unhealthy at start-up: {bad}")
        self.transport = make_transport(plan, cfg, bucket_mb=cfg.sync.bucket_mb, sleep_level=cfg.sync.sleep_level)
        # ZeRO-3 ranks other than 0 hold only shards: they join every gather while rank 0 sends
        gatherers = self.learners[1:] if learner_kwargs.get("zero_stage") == 3 else []
        try:
            self.transport.setup(self.learner, self.engines, self.engine_names, gatherers=gatherers)
        except SyncError as err:
            raise RunError(f"weight sync set-up failed: {err}") from err

    def _engine_class(self) -> tuple[type, dict[str, Any]]:
        if self._engine_cls is not None:
            return self._engine_cls, dict(self._engine_kwargs)
        if self.plan.engine_kind == "hf":
            from rlgen.engines.hf import HFEngine

            return HFEngine, {}
        from rlgen.engines.vllm import VLLMEngine
        from rlgen.sync import engine_args_for

        return VLLMEngine, {"env": dict(self.plan.engine_env), "engine_args": engine_args_for(self.plan.transport)}

    def _learner_class(self) -> tuple[type, dict[str, Any]]:
        ranks = len(self.plan.learners)
        kind = self.cfg.learner.kind.value
        deepspeed = self._learner_cls is None and (kind == "deepspeed" or (kind == "auto" and self.plan.device == "cuda"))
        if ranks > 1 and not deepspeed:
            raise RunError(
                f"the plan has {ranks} learner ranks, but only the DeepSpeed learner (GPUs) trains with several; "
                "set hardware.learner_ranks=1 on CPU."
            )
        if ranks > 1 and self.plan.colocated:
            raise RunError(
                f"colocated engines with {ranks} learner ranks are not supported (the IPC weight path sends from "
                "one rank); give engines their own GPUs (hardware.colocated=false) or use one GPU."
            )
        if self._learner_cls is not None:
            return self._learner_cls, {}
        if deepspeed:
            from rlgen.learners.deepspeed import DeepSpeedLearner

            return DeepSpeedLearner, {
                "zero_stage": self.cfg.learner.zero_stage,
                "gradient_checkpointing": self.cfg.learner.gradient_checkpointing,
                "rows_per_step": self.plan.batch.sequences_per_rank,
                "sync_bucket_bytes": int(self.cfg.sync.bucket_mb * 2**20),
                "release_memory": bool(self.plan.colocated),
                "env": {k: v for k, v in self.plan.engine_env.items() if k.startswith("NCCL_")},
            }
        from rlgen.learners.torch import TorchLearner

        if self.plan.transport.value != "ray_object_store":  # a torch learner feeding vLLM engines on GPUs
            from rlgen.learners.weight_sender import WeightSender

            return type("TorchSyncLearner", (WeightSender, TorchLearner), {}), {}
        return TorchLearner, {}

    # -- helpers ----------------------------------------------------------------------------------------
    def _get(self, refs: Any, what: str, timeout_s: float | None = None) -> Any:
        import ray
        from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError

        timeout_s = self.cfg.timeout_s if timeout_s is None else timeout_s
        key = "timeout_s" if timeout_s == self.cfg.timeout_s else "startup_timeout_s"
        try:
            return ray.get(refs, timeout=timeout_s)
        except GetTimeoutError as err:
            raise RunError(
                f"{what} did not finish within {key}={timeout_s:.0f} s; an actor may be stuck or the "
                f"step too large. Raise {key}=<seconds> or shrink algo.prompts_per_step."
            ) from err
        except RayActorError as err:
            raise RunError(
                f"{what} failed because an actor died ({actor_death_detail(err)}). Metrics up to the last finished "
                f"step are in {self.out_dir}."
            ) from err
        except RayTaskError as err:
            raise RunError(f"{what} raised in an actor: {err.cause!r}") from err

    def _launch(self, step: int, updates: list[Any]) -> InFlight:
        from rlgen.rollout import encode_prompts, sampling_params, split_requests

        sp = encode_prompts(step, self.task, self.tokenizer, self.cfg)
        sampling = sampling_params(self.cfg, self.eos_ids, seed=self.cfg.seed * 100_003 + step)
        shards = split_requests(sp, sampling, len(self.engines))
        refs = [e.generate.remote(reqs) for e, reqs in zip(self.engines, shards) if reqs]
        self._prompts[step] = sp
        return InFlight(step, refs, updates)

    # -- train ------------------------------------------------------------------------------------------
    def train(self, sink) -> dict:

        from rlgen.balancer import BalanceTracker, context_from_plan
        from rlgen.rollout import build_batch, score

        cfg = self.cfg
        tracker = BalanceTracker(context_from_plan(self.plan))
        last_kind = None
        self._prompts: dict[int, Any] = {}
        pending: deque[InFlight] = deque()
        queued_updates: list[Any] = []
        next_gen = 0
        version = 0  # the learner's policy version; engines start with the same weights
        for step in range(cfg.steps):
            t_step = time.time()
            tl = StepTimeline(step)
            while next_gen < cfg.steps and next_gen <= step + self.async_steps:
                pending.append(self._launch(next_gen, queued_updates))
                queued_updates = []
                next_gen += 1

            flight = pending.popleft()
            t0 = time.time()
            results = self._get(flight.refs, f"generation for step {step}")
            updates = self._get(flight.updates, f"weight update before step {step}") if flight.updates else []
            tl.add("learner0", Phase.wait, t0, time.time())
            for name, res in zip(self.engine_names, results):
                for phase, a, b in res["spans"]:
                    tl.add(name, Phase(phase), a, b)
            for name, res in zip(self.engine_names, updates):
                for phase, a, b in res["spans"]:
                    tl.add(name, Phase(phase), a, b)

            t0 = time.time()
            sp = self._prompts.pop(step)
            completions = [c for res in results for c in res["completions"]]
            rewards = score(completions, sp, self.task, self.tokenizer)
            batch = build_batch(completions, rewards, self.pad_id, cfg.algo.std_normalize)
            tl.add("driver", Phase.reward, t0, time.time())

            staleness = version - batch.version
            for r in self.transport.before_train():  # colocated engines sleep while the learner trains
                for phase, a, b in r["spans"]:
                    tl.add(r["actor"], Phase(phase), a, b)
            metrics = self._train(batch, step, tl)

            event = self.breaker.update(step, metrics, batch)
            halt = event is not None and event.action is BreakerAction.halt
            if event is not None:
                sink.console.print(f"[yellow]breaker:[/] {escape(event.message)}", highlight=False)
                if event.action is BreakerAction.tighten:
                    self.async_steps = 0
            pushed = False
            if not metrics.get("skipped"):
                version = int(metrics["version"])
                if not halt:
                    try:
                        res = self.transport.push(version, in_flight=self.async_steps > 0 and bool(pending))
                    except SyncError as err:
                        raise RunError(f"weight sync to version {version} failed: {err}") from err
                    for r in res.results:
                        for phase, a, b in r.get("spans", []):
                            tl.add(r["actor"], Phase(phase), a, b)
                    queued_updates = res.pending  # object store: applied before each engine's next generate
                    pushed = True
            if not pushed:
                self.transport.no_update()  # colocated: wake the engines on their old weights
            metrics.update(self.breaker.metrics())

            rec = self._record(step, tl, batch, rewards, metrics, version, staleness, time.time() - t_step)
            verdict = tracker.update(rec)
            rec["balance"] = verdict.to_dict()
            sink.log(rec)
            if step > 0 and verdict.kind != last_kind:
                sink.console.print(f"[cyan]balance:[/] {verdict.advice}", highlight=False)
            last_kind = verdict.kind
            if halt:
                raise RunError(event.message)
        # Surface any failure of the last weight update rather than dropping it.
        if queued_updates:
            self._get(queued_updates, "final weight update")
        return sink.summary()

    def _train(self, batch, step: int, tl: StepTimeline) -> dict:
        """One optimizer step of the learner group: each rank trains on its shard of the rows; one metrics
        dict comes back, every rank's spans go on the timeline."""
        from rlgen.learners.group import merge_rank_metrics, shard_rows

        if len(self.learners) == 1:
            shards = [batch]
        else:
            import torch

            shards = [batch.select(torch.arange(r.start, r.stop)) for r in shard_rows(batch.num_sequences, len(self.learners))]
        per_rank = self._get([a.train_step.remote(b) for a, b in zip(self.learners, shards)], f"training step {step}")
        for rank, m in enumerate(per_rank):
            for phase, a, b in m.get("spans", []):
                tl.add(f"learner{rank}", Phase(phase), a, b)
        return merge_rank_metrics(per_rank)

    def _record(self, step, tl: StepTimeline, batch, rewards, metrics, version, staleness, step_s) -> dict:
        gen_spans = [s for s in tl.spans if s.phase == Phase.generate]
        gen_wall = (max(s.end for s in gen_spans) - min(s.start for s in gen_spans)) if gen_spans else 0.0
        tokens = batch.num_response_tokens
        n = len(rewards)
        mean = sum(rewards) / n
        std = (sum((r - mean) ** 2 for r in rewards) / n) ** 0.5
        sync_engine = max((s.seconds for s in tl.spans if s.phase == Phase.sync and not s.actor.startswith("learner")),
                          default=0.0)
        train_s = max((tl.total(Phase.train, f"learner{r}") for r in range(len(self.learners) or 1)), default=0.0)
        rec = {
            "step": step,
            "version": version,
            "batch_version": batch.version,
            "staleness": staleness,
            "reward_mean": mean,
            "reward_std": std,
            "response_tokens": tokens,
            "tokens_per_s": tokens / gen_wall if gen_wall > 0 else 0.0,
            "generate_s": gen_wall,
            "reward_s": tl.total(Phase.reward),
            "wait_s": tl.total(Phase.wait, "learner0"),
            "train_s": train_s,
            "sync_s": tl.total(Phase.sync, "learner0") + sync_engine,
            "step_s": step_s,
            # max(gen, train) / step: 1.0 when the shorter side hides entirely behind the longer one
            "overlap_efficiency": max(gen_wall, train_s) / step_s if step_s > 0 else 0.0,
        }
        rec.update({k: v for k, v in metrics.items() if isinstance(v, (int, float, bool, str))})
        rec["version"] = version
        rec["timeline"] = tl.to_dict()["spans"]
        return rec

    # -- cleanup ----------------------------------------------------------------------------------------
    def save_final(self) -> Path:
        path = self.out_dir / "final_model"
        # every rank: ZeRO-3 gathers the full weights collectively; rank 0 writes them
        self._get([a.save.remote(str(path)) for a in self.learners], "saving the final model")
        self.tokenizer.save_pretrained(str(path))  # a complete HF folder: the learner saves weights only
        return path

    def cleanup(self) -> None:
        import ray

        if self.transport is not None:
            self.transport.close()
        if not ray.is_initialized():
            return
        for a in [*self.engines, *self.learners]:
            if a is not None:
                try:
                    ray.kill(a)
                except Exception:  # noqa: BLE001 - best effort on the way out
                    pass
        from ray.util.placement_group import remove_placement_group

        for pg in self.pgs:
            try:
                remove_placement_group(pg)
            except Exception:  # noqa: BLE001
                pass
        if self._started_ray:
            ray.shutdown()
