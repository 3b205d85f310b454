"""Cancelling generation on engines that are Ray actors, as `rlgen serve` runs them: Ray cannot interrupt a running
call of such an actor, so the engine polls Ray's cancel mark between steps (rlgen.engines.cancel). An hf engine
actor slowed to 20 ms a step (a 100-token answer takes about 2 s) stops early when the pool's call is cancelled
(a client that disconnected), when it times out, and when a stream is left after its first event; the engine
then serves the next call whole."""

from __future__ import annotations

import asyncio
import sys
import time

import pytest

from rlgen.config import EngineConfig
from rlgen.engines.hf.engine import HFEngine
from rlgen.serve.pool import EnginePool, ServedModel
from rlgen.types import GenRequest, SamplingParams
from rlgen.wire.protocol import BadRequest

ray = pytest.importorskip("ray")

STEP_S = 0.02
TOKENS = 100


class SlowEngine(HFEngine):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.model.register_forward_pre_hook(lambda *_: time.sleep(STEP_S))

    def generated(self) -> int:
        return self.tokens


@pytest.fixture(scope="module")
def engine():
    from rlgen.config.compose import compose_run_config
    from rlgen.models import prepare_model

    path = prepare_model(compose_run_config([]))
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])  # SlowEngine, where workers cannot import it
    actor = ray.remote(SlowEngine).options(max_concurrency=4).remote(path, EngineConfig(dtype="float32"))
    ray.get(actor.health.remote(), timeout=120)
    yield actor, path
    ray.shutdown()


def _pool(actor, path, timeout_s: float) -> EnginePool:
    return EnginePool([actor], ServedModel("tiny", path, 0, 512, 128, "hf", 1), timeout_s=timeout_s)


def _request(tokens: int = TOKENS) -> list[GenRequest]:
    return [GenRequest((5, 6, 7, 8), SamplingParams(max_new_tokens=tokens, ignore_eos=True), 0)]


def _generated_after(actor, before: int) -> int:
    deadline = time.time() + 15
    while ray.get(actor.generated.remote(), timeout=10) == before and time.time() < deadline:
        time.sleep(0.05)
    return ray.get(actor.generated.remote(), timeout=10) - before


def test_a_cancelled_call_stops_the_engine(engine):
    actor, path = engine
    pool = _pool(actor, path, 60.0)
    before = ray.get(actor.generated.remote(), timeout=10)

    async def leave_early() -> None:
        task = asyncio.ensure_future(pool.generate(_request()))
        await asyncio.sleep(0.6)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(leave_early())
    generated = _generated_after(actor, before)
    assert 0 < generated < TOKENS, f"{generated} tokens: the engine ran on after its call was cancelled"
    whole = asyncio.run(pool.generate(_request(20)))["completions"][0]
    assert len(whole.token_ids) == 20


def test_a_call_that_times_out_stops_the_engine(engine):
    actor, path = engine
    pool = _pool(actor, path, 1.0)
    before = ray.get(actor.generated.remote(), timeout=10)
    with pytest.raises(BadRequest) as err:
        asyncio.run(pool.generate(_request()))
    assert err.value.status == 504
    generated = _generated_after(actor, before)
    assert 0 < generated < TOKENS, f"{generated} tokens: the engine ran on after its call timed out"


def test_a_stream_left_early_stops_the_engine(engine):
    actor, path = engine
    pool = _pool(actor, path, 60.0)
    before = ray.get(actor.generated.remote(), timeout=10)

    async def first_event() -> dict:
        stream = pool.generate_stream(_request())
        event = await stream.__anext__()
        await stream.aclose()
        return event

    assert "deltas" in asyncio.run(first_event())
    generated = _generated_after(actor, before)
    assert 0 < generated < TOKENS, f"{generated} tokens: the stream's generation ran on after it was left"


def test_cancelling_one_call_leaves_the_others_running(engine):
    """Ray's cancel mark is per call: of two calls running at once on the threaded actor, the cancelled one stops
    and the other returns whole."""
    actor, path = engine
    pool = _pool(actor, path, 60.0)

    async def two_calls() -> list:
        left = asyncio.ensure_future(pool.call(0, "generate", _request(), cancel=True))
        kept = asyncio.ensure_future(pool.call(0, "generate", _request(), cancel=True))
        await asyncio.sleep(0.6)
        left.cancel()
        return (await kept).completions

    assert len(asyncio.run(two_calls())[0].token_ids) == TOKENS
