"""What the run's error says when an actor died: Ray's first line plus the exception its constructor raised."""

from __future__ import annotations

from rlgen.runtime import actor_death_detail

RAY_MESSAGE = """The actor died because of an error raised in its creation task, ray::VLLMEngine.__init__() (pid=7)
Traceback (most recent call last):
  File "/site/rlgen/engines/vllm.py", line 140, in __init__
    self.llm = self._loop.run(self._build(), START_TIMEOUT_S, "starting")
  File "/site/vllm/config/model.py", line 900, in __post_init__
    raise ValueError(msg)
ValueError: User-specified max_model_len (4096) is greater than the derived max_model_len (128)."""


def test_the_constructor_exception_reaches_the_message():
    got = actor_death_detail(RuntimeError(RAY_MESSAGE))
    assert got.startswith("The actor died because of an error raised in its creation task")
    assert got.endswith("ValueError: User-specified max_model_len (4096) is greater than the derived max_model_len (128).")
    assert "File " not in got  # no stack frames, only the exception


def test_a_plain_death_keeps_its_one_line():
    assert actor_death_detail(RuntimeError("The actor died unexpectedly before finishing this task.")) == (
        "The actor died unexpectedly before finishing this task."
    )
    assert actor_death_detail(RuntimeError("")) == "RuntimeError"
