"""A Ray call in a run's process while it is not connected raises instead of starting a Ray instance of its own
(which would make the run's own ray.init() fail as "called twice")."""

from __future__ import annotations

import pytest
import ray
from ray._private import auto_init_hook

from rlgen.runtime.cluster.actors import no_auto_connect


def test_a_ray_call_before_the_run_connects_raises_and_starts_nothing(monkeypatch):
    if ray.is_initialized():
        pytest.skip("this process is connected to Ray already")
    monkeypatch.setattr(auto_init_hook, "enable_auto_connect", auto_init_hook.enable_auto_connect)
    no_auto_connect()
    with pytest.raises(Exception, match="not been started|not initialized|not connected"):
        ray.put(1)
    assert not ray.is_initialized()
