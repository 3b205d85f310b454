"""Every YAML of the config tree composes, and — paired with what it needs — plans."""

from __future__ import annotations

import functools
import shutil
from pathlib import Path

import pytest
from omegaconf import OmegaConf

import rlgen.config.compose
from helpers import ALGO_NEEDS
from rlgen.config import _GROUPS
from rlgen.config.compose import CONF_DIR, ConfigError, compose_run_config
from rlgen.plan import build_plan

REPO = Path(__file__).resolve().parents[2]
TREE = REPO / "src" / "rlgen" / "conf"
YAMLS = sorted((p.parent.name, p.stem) for p in TREE.glob("*/*.yaml"))
YAML_IDS = [f"{g}={n}" for g, n in YAMLS]


def _package(group: str, name: str) -> str:
    """Where a group option's values land: its `# @package` header's node, or its group's."""
    first = (TREE / group / f"{name}.yaml").read_text().splitlines()[0]
    return first.split("@package", 1)[1].strip() if "@package" in first else group


PRESET_GROUPS = {g for g, n in YAMLS if _package(g, n) != g}  # presets over another group's node (correction)
SCHEMA_YAMLS = [(g, n) for g, n in YAMLS if g not in PRESET_GROUPS]  # those that start from their group's schema
SCHEMA_IDS = [f"{g}={n}" for g, n in SCHEMA_YAMLS]


@pytest.mark.parametrize("name", sorted(n for g, n in YAMLS if g in PRESET_GROUPS))
def test_a_preset_over_another_node_sets_values_only(name):
    raw = OmegaConf.to_container(OmegaConf.load(TREE / "correction" / f"{name}.yaml"))
    assert "defaults" not in raw and raw  # no base of its own: it overrides the algo preset's values, no others
    assert set(raw) <= set(OmegaConf.to_container(OmegaConf.structured(_composed().algo)))


@functools.cache
def _composed(*overrides: str):
    """compose_run_config, memoised: several tests here read the same compositions (none mutates them)."""
    return compose_run_config(list(overrides))


def _companions(group: str, name: str, tmp_path: Path) -> list[str]:
    """What a group option needs beside it for the plan to validate."""
    if group == "algo" and name in ALGO_NEEDS:
        return ALGO_NEEDS[name]
    if group == "engine" and name == "remote":  # a server's address (its /info is stood in for by the test)
        return ["engine.url=http://127.0.0.1:9"]
    if group == "engine" and name.startswith("vllm"):
        return ["hardware=8xh100"]  # vLLM needs GPUs
    if group == "hardware" and not name.endswith("cpu") and name != "auto":  # auto finds no GPU here
        return ["engine=vllm"]
    if group == "task" and name == "jsonl":
        rows = tmp_path / "rows.jsonl"
        rows.write_text('{"prompt": "1+1=", "answer": "2"}\n')
        return [f"task.path={rows}"]
    if group == "task" and name in ("dataset", "gsm8k", "math"):  # long prompts: a model with a longer context
        return [f"task.path={tmp_path / 'rows.jsonl'}", "model.max_position_embeddings=2048",
                "engine.max_model_len=2048"]
    if group == "task" and name == "env":  # an environment of one's own, and room for its episodes
        return ["task.env=chain", "model.max_position_embeddings=512"]
    if group == "task" and name in ("calculator", "python"):  # tool tasks: long episodes
        return ["model.max_position_embeddings=4096"]
    if group == "task" and name == "verifiers":  # an environment by id (tests/envs/vf_chain.py), room for episodes
        return ["task.env_args.env=vf_chain", "model.max_position_embeddings=512"]
    return []


def _yaml_values(group: str, name: str) -> dict:
    raw = OmegaConf.to_container(OmegaConf.load(TREE / group / f"{name}.yaml"))
    raw.pop("defaults", None)
    return raw


def _assert_subset(expected: dict, actual: dict, where: str) -> None:
    for key, value in expected.items():
        assert key in actual, f"{where}.{key} from the YAML is missing from the composed config"
        if isinstance(value, dict):
            _assert_subset(value, actual[key], f"{where}.{key}")
        elif isinstance(value, float) or isinstance(actual[key], float):
            assert actual[key] == pytest.approx(value), f"{where}.{key}"
        else:
            assert actual[key] == value, f"{where}.{key}: YAML says {value!r}, composed {actual[key]!r}"


def test_tree_discovery_covers_every_schema_group():
    groups = {g for g, _ in YAMLS} - PRESET_GROUPS
    assert PRESET_GROUPS == {"correction"} and all(_package("correction", n) == "algo" for g, n in YAMLS
                                                  if g == "correction")
    assert groups == set(_GROUPS), (
        "each conf/<group>/ must have a schema in rlgen.config._GROUPS and vice versa"
    )
    assert len(YAMLS) >= 15
    assert ("engine", "vllm_tp2") in YAMLS and ("hardware", "2x8xh100") in YAMLS


def test_package_tree_is_the_one_composed_and_the_repo_symlink_points_at_it():
    assert CONF_DIR.resolve() == TREE.resolve()
    assert (REPO / "conf").resolve() == TREE.resolve()
    assert (TREE / "config.yaml").is_file()


@pytest.mark.parametrize(("group", "name"), YAMLS, ids=YAML_IDS)
def test_yaml_composes_alone_with_its_values(group, name):
    cfg = _composed(f"{group}={name}")
    node = _package(group, name)
    composed = OmegaConf.to_container(OmegaConf.structured(getattr(cfg, node)), enum_to_str=True)
    _assert_subset(_yaml_values(group, name), composed, node)


def _server_info(url, token, timeout_s=10.0):
    """/info of a server of the tiny default's model: one hf engine."""
    from rlgen.plan import count_params

    params, vocab = count_params(_composed().model)
    return {"model": "tiny", "params": params, "vocab_size": vocab, "data_parallel": 1, "tensor_parallel_size": 1,
            "max_model_len": 128, "engine_kind": "hf"}


@pytest.mark.parametrize(("group", "name"), YAMLS, ids=YAML_IDS)
def test_yaml_plans_with_its_companions(group, name, tmp_path, monkeypatch):
    monkeypatch.setattr("rlgen.engines.remote.plan.fetch_info", _server_info)
    monkeypatch.syspath_prepend(str(Path(__file__).resolve().parents[1] / "envs"))  # task=verifiers' environment
    monkeypatch.setattr("rlgen.plan.checks.cards._query", lambda: "")  # hardware=auto finds no GPU (as in CI)
    companions = _companions(group, name, tmp_path)
    cfg = compose_run_config([f"{group}={name}", *companions]) if companions else _composed(f"{group}={name}")
    plan = build_plan(cfg)
    assert plan.engines and plan.learners
    if cfg.hardware.name == "auto":  # planned for what it found: here, nothing
        assert plan.hardware == "auto:cpu"
        cfg = plan.config
    assert plan.hardware == cfg.hardware.name
    assert plan.engine_kind == cfg.engine.kind
    assert all(e.tensor_parallel_size == cfg.engine.tensor_parallel_size for e in plan.engines)
    assert plan.model.name == cfg.model.name
    hw = plan.config.hardware  # the layout as the plan resolved it (the multi-GPU presets leave it null)
    assert None not in (hw.colocated, hw.engine_gpus, hw.learner_gpus)
    if hw.gpus_per_node:
        assert plan.device == "cuda"
        used_by_engines = len({(e.node, g) for e in plan.engines for g in e.gpus})  # engines may share a GPU
        if plan.colocated:
            total = hw.nodes * hw.gpus_per_node
            assert used_by_engines == total and len(plan.learners) == total
        else:
            assert used_by_engines == hw.engine_gpus
            assert len(plan.learners) == hw.learner_gpus
    else:
        assert plan.device == "cpu"
        assert all(e.gpus == () for e in plan.engines)
        assert all(lr.gpu is None for lr in plan.learners)


def _defaults(group: str, name: str) -> list:
    return list(OmegaConf.to_container(OmegaConf.load(TREE / group / f"{name}.yaml")).get("defaults") or [])


@pytest.mark.parametrize(("group", "name"), SCHEMA_YAMLS, ids=SCHEMA_IDS)
def test_yaml_defaults_start_from_the_schema_and_end_with_self(group, name):
    defaults = _defaults(group, name)
    assert defaults, f"conf/{group}/{name}.yaml has no defaults list; start it with [base_{group}, _self_]"
    siblings = {n for g, n in YAMLS if g == group} - {name}
    assert defaults[0] == f"base_{group}" or defaults[0] in siblings, (
        f"conf/{group}/{name}.yaml defaults start with {defaults[0]!r}, not base_{group} or a sibling YAML"
    )
    assert defaults[-1] == "_self_", "the file's own values must come last so they override the base"


@pytest.mark.parametrize(("group", "name"), SCHEMA_YAMLS, ids=SCHEMA_IDS)
def test_yaml_inheritance_chain_reaches_the_schema(group, name):
    seen = [name]
    current = name
    while True:
        first = _defaults(group, current)[0]
        if first == f"base_{group}":
            break
        assert first not in seen, f"conf/{group}: defaults cycle {seen + [first]}"
        seen.append(first)
        current = first


def test_root_config_starts_from_the_schema():
    defaults = OmegaConf.to_container(OmegaConf.load(TREE / "config.yaml"))["defaults"]
    assert defaults[0] == "base_config"
    assert defaults[-1] == "_self_"
    chosen = {k: v for d in defaults if isinstance(d, dict) for k, v in d.items() if not k.startswith("override hydra/")}
    presets = {k: chosen.pop(k) for k in PRESET_GROUPS}  # none chosen: the algo preset's own values stand
    assert presets == {"correction": None} and list(chosen).index("algo") < [
        next(iter(d)) for d in defaults if isinstance(d, dict)].index("correction")  # over the algo preset
    assert set(chosen) == set(_GROUPS)
    for group, name in chosen.items():
        assert (TREE / group / f"{name}.yaml").is_file()


def test_base_schemas_are_registered():
    from hydra.core.config_store import ConfigStore

    from rlgen.config import register_configs

    register_configs()
    register_configs()  # idempotent
    cs = ConfigStore.instance()
    for group in _GROUPS:
        assert f"base_{group}.yaml" in cs.list(group)
    assert "base_config.yaml" in cs.list("")


@pytest.mark.parametrize("group", sorted(_GROUPS))
def test_unknown_key_in_override_names_the_key(group):
    with pytest.raises(ConfigError) as info:
        compose_run_config([f"{group}.no_such_setting=1"])
    msg = str(info.value)
    assert f"{group}.no_such_setting" in msg
    assert "misspelled" in msg
    assert "\n" not in msg


def test_unknown_key_lists_the_known_keys():
    with pytest.raises(ConfigError) as info:
        compose_run_config(["engine.max_modl_len=5"])
    assert "engine.max_modl_len is not a setting of engine" in str(info.value)
    assert "max_model_len" in str(info.value).split("known keys there:")[1]


def test_unknown_top_level_key():
    with pytest.raises(ConfigError, match="stepz is not a setting of the top level"):
        compose_run_config(["stepz=3"])


@pytest.fixture
def scratch_tree(tmp_path, monkeypatch):
    """A copy of the config tree that compose_run_config reads instead of the packaged one."""
    tree = tmp_path / "conf"
    shutil.copytree(TREE, tree)
    monkeypatch.setattr(rlgen.config.compose, "CONF_DIR", tree)
    return tree


def test_unknown_key_in_a_yaml_fails(scratch_tree):
    (scratch_tree / "engine" / "typo.yaml").write_text("defaults: [base_engine, _self_]\nmax_modl_len: 5\n")
    assert compose_run_config(["engine=vllm"]).engine.kind == "vllm"  # the copy itself is sound
    with pytest.raises(ConfigError, match=r"conf/engine/typo.yaml: engine.max_modl_len is not a setting of engine"):
        compose_run_config(["engine=typo"])


def test_bad_value_type_in_a_yaml_names_the_key(scratch_tree):
    (scratch_tree / "engine" / "badtype.yaml").write_text(
        "defaults: [base_engine, _self_]\nmax_model_len: lots\n"
    )
    with pytest.raises(ConfigError) as info:
        compose_run_config(["engine=badtype"])
    assert "max_model_len" in str(info.value)
    assert "lots" in str(info.value)


def test_appended_unknown_key_fails():
    with pytest.raises(ConfigError, match="bogus"):
        compose_run_config(["+engine.bogus=1"])


def test_new_engine_env_entry_can_be_appended():
    cfg = compose_run_config(["engine=vllm", "+engine.env.MY_FLAG=on"])
    assert cfg.engine.env["MY_FLAG"] == "on"
    assert cfg.engine.env["NCCL_CUMEM_ENABLE"] == "0"  # the YAML's entries stay
