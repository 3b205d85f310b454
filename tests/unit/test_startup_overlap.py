"""What set-up overlaps: an engine that starts before its model folder exists (runtime.start.early_engines), the
random folders of full-vocabulary presets shared by every seed (models.build.seeded), and the loaders' shared
imports, which leave transformers' model side out where the driver builds nothing (runtime.start.loaders)."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from rlgen.config import ModelConfig, RunConfig
from rlgen.models.build import cache_key, prepare_model, seeded
from rlgen.phases import ActorClock
from rlgen.runtime.start.early_engines import FOLDER_WAIT, after_folder


class StandIn:
    """An engine's constructor and health report, as the engine protocol has them."""

    def __init__(self, model_path: str, engine: object = None, name: str = "engine0", env: dict | None = None):
        self.clock = ActorClock()
        self.model_path, self.name, self.env = model_path, name, env
        assert Path(model_path).is_dir()  # the folder is there when the engine's own start begins
        time.sleep(0.05)
        self.clock.step("weights")
        self.clock.done()

    def health(self) -> dict:
        return {"ok": True, "name": self.name, "startup": self.clock.to_dict()}


def _imports(env: dict | None) -> str:
    time.sleep(0.1)
    return "import weights"


def test_an_engine_asked_for_before_its_folder_waits_for_it_and_counts_the_wait(tmp_path):
    folder = tmp_path / "model"
    cls = after_folder(StandIn, _imports, wait_s=30)
    later = threading.Timer(0.3, folder.mkdir)
    later.start()
    t0 = time.time()
    engine = cls(str(folder), None, name="engine1", env={"A": "1"})
    assert isinstance(engine, StandIn) and engine.env == {"A": "1"} and engine.name == "engine1"
    startup = engine.health()["startup"]
    steps = startup["steps"]
    assert list(steps) == ["import weights", FOLDER_WAIT, "weights"]
    assert steps["import weights"] >= 0.1 and steps[FOLDER_WAIT] >= 0.1
    assert t0 <= startup["init_begin"] < engine.clock.init_begin  # the engine's start began with its process
    # a later start (a kept engine taken over) has a clock of its own, which the report is left to
    engine.clock = ActorClock()
    engine.clock.done()
    assert engine.health()["startup"]["steps"] == {}


def test_an_engine_whose_folder_never_comes_says_so(tmp_path):
    cls = after_folder(StandIn, None, wait_s=0.2)
    with pytest.raises(RuntimeError, match="did not appear within"):
        cls(str(tmp_path / "never"))


def _cfg(tmp_path: Path, seed: int = 0, vocab: int = 512, warm: int = 0) -> RunConfig:
    return RunConfig(cache_dir=str(tmp_path), seed=seed,
                     model=ModelConfig(name="wide", vocab_size=vocab, warm_start_steps=warm))


def test_a_full_vocabulary_preset_is_one_folder_for_every_seed(tmp_path):
    assert not seeded(_cfg(tmp_path).model)
    assert seeded(_cfg(tmp_path, vocab=0).model) and seeded(_cfg(tmp_path, warm=3).model)
    assert cache_key(_cfg(tmp_path, seed=0)) == cache_key(_cfg(tmp_path, seed=7))
    assert cache_key(_cfg(tmp_path, vocab=0)) != cache_key(_cfg(tmp_path, vocab=0, seed=7))
    assert cache_key(_cfg(tmp_path, warm=3)) != cache_key(_cfg(tmp_path, warm=3, seed=7))
    # built once, whatever the seed; the same weights as a build in another cache (drawn by the shape alone)
    a = prepare_model(_cfg(tmp_path / "a", seed=3))
    assert prepare_model(_cfg(tmp_path / "a", seed=5)) == a
    b = prepare_model(_cfg(tmp_path / "b", seed=0))
    wa, wb = (load_file(str(Path(p) / "model.safetensors")) for p in (a, b))
    assert wa.keys() == wb.keys() and all(torch.equal(wa[k], wb[k]) for k in wa)


IMPORTED = """
import sys
from rlgen.config import RunConfig
from rlgen.runtime.start.loaders import _shared_libraries

named = "transformers.models.qwen2.tokenization_qwen2" if sys.argv[1] == "named" else None
_shared_libraries(RunConfig(), builds=sys.argv[1] == "build", tokenizer_module=named)
print("model side" if "transformers.modeling_utils" in sys.modules else "tokenizer side",
      "torch" in sys.modules, "transformers.models.auto.tokenization_auto" in sys.modules)
"""


@pytest.mark.parametrize(("folder", "said"), [("build", "model side True True"), ("found", "tokenizer side True True"),
                                              ("named", "tokenizer side True False")])
def test_the_shared_imports_leave_out_what_the_folder_does_not_need(folder, said):
    got = subprocess.run([sys.executable, "-c", IMPORTED, folder], capture_output=True, text=True, timeout=300)
    assert got.returncode == 0, got.stderr[-3000:]
    assert got.stdout.split() == said.split()


def test_a_built_folder_names_its_tokenizers_class_and_loads_the_same_tokenizer_by_it(tmp_path, monkeypatch):
    from transformers import AutoTokenizer

    import rlgen.models.build as build

    path = prepare_model(_cfg(tmp_path, vocab=0))
    named = build.tokenizer_class_of(path)
    auto = AutoTokenizer.from_pretrained(path)
    assert named == (type(auto).__module__, type(auto).__qualname__)
    monkeypatch.setattr(AutoTokenizer, "from_pretrained", None)  # not reached: the class is named
    direct = build.load_tokenizer(path)
    assert type(direct) is type(auto) and len(direct) == len(auto) and direct.init_kwargs == auto.init_kwargs
    assert direct.all_special_ids == auto.all_special_ids
    assert all(direct.encode(t) == auto.encode(t) for t in ("12+7=19", "ab cd>dc ba", "héllo <eos>"))
    # a folder that names none (built before, or a user's) is AutoTokenizer's; a preset's is named then
    monkeypatch.undo()
    Path(path, build.TOKENIZER_CLASS).unlink()
    assert type(build.load_tokenizer(path)) is type(auto) and build.tokenizer_class_of(path) is None
    build.load_tokenizer(path, note=True)
    assert build.tokenizer_class_of(path) == named
    monkeypatch.setattr(build, "version", lambda pkg: "another")  # named by another transformers: not trusted
    assert build.tokenizer_class_of(path) is None


def test_vllm_does_its_imports_before_the_folder_with_the_engines_environment(monkeypatch):
    import os

    from rlgen.engines.registry import engine_spec
    from rlgen.engines.vllm import before_model_folder
    from rlgen.engines.vllm.args import REQUIRED_ENV
    from rlgen.runtime.start.early_engines import before_folder_hook

    assert before_folder_hook(engine_spec("vllm")) is before_model_folder
    assert before_folder_hook(engine_spec("hf")) is None  # nothing to do before its folder: asked for after it
    monkeypatch.setattr(os, "environ", {k: v for k, v in os.environ.items() if k not in REQUIRED_ENV})
    # no GPU here: what the engine's own start would say is left to it
    assert before_model_folder({"VLLM_TEST_SETTING": "1"}) == "import vllm"
    assert os.environ["VLLM_TEST_SETTING"] == "1"
    assert all(os.environ[k] == v for k, v in REQUIRED_ENV.items())  # before torch looks for a GPU
