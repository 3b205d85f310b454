"""A step made long by its environment's timeouts is said to be so, with the numbers and the settings that
shorten it, not blamed on a stuck actor: the timeout sentence, the console's note once timeouts made a step long,
and the plan's note where one slow episode alone would pass timeout_s."""

from __future__ import annotations

from rlgen.config.compose import compose_run_config
from rlgen.engines.episodes import EpisodeSpec
from rlgen.plan import build_plan
from rlgen.plan.env_bound import EnvBound, env_bound
from rlgen.runtime.cluster.waits import did_not_finish
from rlgen.runtime.rollouts.batch import StepPrompts
from rlgen.runtime.rollouts.in_flight import InFlight
from rlgen.runtime.step.score import timeouts_sentence
from rlgen.tasks.base import Prompt
from rlgen.types import GenRequest, SamplingParams


def test_the_timeout_sentence_says_what_the_environment_calls_may_take():
    bound = EnvBound(env_timeout_s=1, max_turns=4, episodes=512, env_workers=16)
    assert (bound.calls, bound.rounds, bound.seconds) == (5, 32, 160)
    said = did_not_finish("generation for step 0", "timeout_s", 30, bound)
    assert said == ("generation for step 0 did not finish within timeout_s=30 s: its episodes' environment calls "
                    "alone may take up to task.env_timeout_s=1 s a call x 5 calls an episode (task.max_turns=4 + 1) "
                    "x 32 (the 512 episodes an engine plays, task.env_workers=16 at a time) = 160 s; lower "
                    "task.env_timeout_s, raise task.env_workers, or raise timeout_s above 160.")
    assert "stuck" not in said
    plain = did_not_finish("generation for step 0", "timeout_s", 30)
    assert plain == ("generation for step 0 did not finish within timeout_s=30 s; an actor may be stuck or the step "
                     "too large. Raise timeout_s=<seconds> or shrink algo.prompts_per_step.")
    short = did_not_finish("generation for step 0", "timeout_s", 600, bound)  # not why: said beside the usual
    assert "stuck" in short and "take up to task.env_timeout_s=1 s a call" in short


def test_a_flight_of_episodes_knows_its_bound_from_the_busiest_engine():
    spec = EpisodeSpec(env="chain", env_args={}, prompt=Prompt("1+1=", "2"), chat=False, max_turns=2,
                       env_timeout_s=5, env_workers=4)
    s = SamplingParams(n=3)
    shards = [[GenRequest((1,), s, 0, episode=spec), GenRequest((1,), s, 2, episode=spec)],
              [GenRequest((1,), s, 1, episode=spec)]]
    flight = InFlight(0, StepPrompts(0, [], []), shards, 0)
    assert flight.env_bound() == EnvBound(5, 2, 6, 4)
    assert InFlight(0, StepPrompts(0, [], []), [[GenRequest((1,), s, 0)]], 0).env_bound() is None
    cfg = compose_run_config(["task=chain", "algo.prompts_per_step=5"])
    assert env_bound(cfg, engines=2) == EnvBound(30, 2, 3 * cfg.algo.samples_per_prompt, 16)


def test_the_console_says_when_timeouts_made_a_step_long():
    said = timeouts_sentence(3, [72, 10], gen_s=8.0, env_timeout_s=1, env_workers=16)
    assert said == ("step 3: 82 episodes' environment calls ran past task.env_timeout_s=1 s and were killed; waiting "
                    "for them took at least 5 s of the step's 8 s of generation (72 on one engine, task.env_workers=16 "
                    "at a time). Lower task.env_timeout_s, raise task.env_workers, or raise timeout_s if steps run "
                    "past it (env/timeouts counts them each step).")
    assert timeouts_sentence(3, [2], gen_s=60.0, env_timeout_s=1, env_workers=16) is None  # 1 s of 60: not why
    assert timeouts_sentence(3, [72], gen_s=35.0, env_timeout_s=1, env_workers=16) is not None  # 5 s of 35
    assert timeouts_sentence(3, [0], gen_s=1.0, env_timeout_s=1, env_workers=16) is None


def test_the_plan_notes_a_timeout_s_one_slow_episode_passes():
    assert not any("task.env_timeout_s" in w for w in build_plan(compose_run_config(["task=chain"])).warnings)
    plan = build_plan(compose_run_config(["task=chain", "task.env_timeout_s=120"]))
    [note] = [w for w in plan.warnings if "task.env_timeout_s" in w]
    assert note.startswith("task.env_timeout_s=120 s a call x 3 calls an episode (task.max_turns=2 + 1) = 360 s is "
                           "not below timeout_s=300")
    assert note.endswith("lower task.env_timeout_s, or raise timeout_s above 360.")
