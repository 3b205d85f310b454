"""One step's line of metrics.jsonl, from its timeline, batch and the learner's metrics."""

from __future__ import annotations

import math
import time
import zlib
from collections.abc import Mapping

from rlgen.types import JSONDict, Phase, RolloutBatch, StepTimeline


def step_record(step: int, tl: StepTimeline, batch: RolloutBatch, rewards: list[float], metrics: Mapping[str, object],
                version: int, staleness: int, step_s: float, learner_ranks: int) -> JSONDict:
    gen_spans = [s for s in tl.spans if s.phase == Phase.generate]
    gen_wall = (max(s.end for s in gen_spans) - min(s.start for s in gen_spans)) if gen_spans else 0.0
    tokens = batch.num_response_tokens
    finite = [r for r in rewards if math.isfinite(r)]  # a NaN reward is counted (reward/nan), not averaged
    n = len(rewards)
    mean = sum(finite) / len(finite) if finite else 0.0
    std = (sum((r - mean) ** 2 for r in finite) / len(finite)) ** 0.5 if finite else 0.0
    sync_engine = max((s.seconds for s in tl.spans if s.phase == Phase.sync and not s.actor.startswith("learner")),
                      default=0.0)
    train_s = max((tl.total(Phase.train, f"learner{r}") for r in range(learner_ranks or 1)), default=0.0)
    rec = {
        "step": step,
        "version": version,
        "batch_version": batch.version,
        "staleness": staleness,
        "reward_mean": mean,
        "reward_std": std,
        "response_tokens": tokens,
        "sequences": n,
        "tokens_per_s": tokens / gen_wall if gen_wall > 0 else 0.0,
        "generate_s": gen_wall,
        "reward_s": tl.total(Phase.reward),
        "wait_s": tl.total(Phase.wait, "learner0"),
        "teacher_s": max((tl.total(Phase.teacher, f"learner{r}") for r in range(learner_ranks or 1)), default=0.0),
        "train_s": train_s,
        # the update's wall time: the learner's send and the engines' loads overlap (NCCL, CUDA IPC)
        "sync_s": tl.covered(Phase.sync),
        # how long the update kept engines from generating (an in-flight update: its pause, else its whole span)
        "sync_pause_s": sync_engine,
        "step_s": step_s,
        "t_end": time.time(),  # wall clock at the step's end
        # max(gen, train) / step: 1.0 when the shorter side hides entirely behind the longer one
        "overlap_efficiency": max(gen_wall, train_s) / step_s if step_s > 0 else 0.0,
    }
    rec.update(token_version_metrics(batch, batch.version + staleness))
    rec.update(batch_digest(batch))
    rec.update({k: v for k, v in metrics.items() if isinstance(v, (int, float, bool, str))})
    rec["version"] = version
    rec["timeline"] = tl.to_dict()["spans"]
    return rec


def batch_digest(batch: RolloutBatch) -> dict[str, int]:
    """CRC-32s of the step's batch as the learners got it, in row order: its token ids (prompts and responses) and
    the engines' logprob of each response token, as float32 bytes. Two runs whose digests agree at a step sampled
    the same tokens with the same logprobs, bit for bit (deterministic=true, docs/correctness.md)."""
    mask = batch.response_mask.bool()
    ids = batch.input_ids.to("cpu").long().contiguous().numpy().tobytes()
    logp = batch.engine_logprobs.to("cpu").float()[mask.to("cpu")].contiguous().numpy().tobytes()
    return {"digest/tokens": zlib.crc32(ids), "digest/engine_logprobs": zlib.crc32(logp)}


def token_version_metrics(batch: RolloutBatch, learner_version: int) -> dict[str, float]:
    """Per token: how many versions behind the learner each response token was sampled, on average, and the
    share of tokens sampled after an in-flight update changed the weights under their sequence."""
    tv = getattr(batch, "token_versions", None)
    mask = batch.response_mask.bool()
    if tv is None or not bool(mask.any()):
        return {}
    versions = tv[mask].float()
    first = tv[:, :1].expand_as(tv)[mask]  # each row's first token: its version when sampling began
    return {"token_staleness_mean": float((learner_version - versions).mean()),
            "tokens_after_update_frac": float((versions > first).float().mean())}
