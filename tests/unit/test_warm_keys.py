"""runtime.cluster.kept_engines's keys: a kept cluster or engine is taken over only by a run that would build it the same way."""

from __future__ import annotations

import dataclasses

from rlgen.config import EngineConfig
from rlgen.runtime.cluster import kept_engines as warm


class _Engine:
    pass


class _Other:
    pass


def test_engine_key_follows_every_setting_and_the_class():
    args = {"model_path": "/m", "engine": EngineConfig(kind="hf"), "seed": 1, "name": "engine0"}
    key = warm.engine_key(_Engine, args)
    assert key == warm.engine_key(_Engine, dict(args))  # stable
    assert key != warm.engine_key(_Other, args)
    assert key != warm.engine_key(_Engine, {**args, "seed": 2})
    assert key != warm.engine_key(_Engine, {**args, "model_path": "/n"})
    assert key != warm.engine_key(_Engine, {**args, "engine": dataclasses.replace(args["engine"], max_num_seqs=7)})


def test_cluster_key_follows_the_start_arguments_and_bundles():
    key = warm.cluster_key({"num_cpus": 16}, [[{"CPU": 1.0, "GPU": 0.5}]])
    assert key == warm.cluster_key({"num_cpus": 16}, [[{"CPU": 1.0, "GPU": 0.5}]])
    assert key != warm.cluster_key({"num_cpus": 8}, [[{"CPU": 1.0, "GPU": 0.5}]])
    assert key != warm.cluster_key({"num_cpus": 16}, [[{"CPU": 1.0, "GPU": 0.5}], [{"CPU": 1.0}]])


def test_names_carry_the_key():
    assert warm.engine_name("engine0", "abc") == "rlgen-warm-engine0-abc"
    assert warm.group_name("abc", 0) != warm.group_name("abc", 1)
