import json
import threading
import time
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from rlgen.charvocab import BOS, CHAR_VOCAB, CHAR_VOCAB_SIZE, EOS, PAD
from rlgen.config import ModelConfig, RunConfig, TaskConfig, TaskKind
from rlgen.models import build as models
from rlgen.models import build_tokenizer, cache_key, hf_config, load_tokenizer, prepare_model
from rlgen.tasks import build_task


def run_cfg(tmp_path, steps: int = 0, seed: int = 0, **task) -> RunConfig:
    return RunConfig(
        cache_dir=str(tmp_path), seed=seed, model=ModelConfig(warm_start_steps=steps), task=TaskConfig(**task)
    )


def built_models(tmp_path) -> list[Path]:
    return sorted(p for p in (Path(tmp_path) / "models").iterdir() if p.is_dir())


def greedy_accuracy(path: str, task, n: int = 128) -> float:
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    tok = load_tokenizer(path)
    prompts = task.prompts(999, n)
    ids = [tok.encode(p.text) for p in prompts]
    width = max(map(len, ids))
    inputs = torch.tensor([[tok.pad_token_id] * (width - len(i)) + i for i in ids])
    mask = torch.tensor([[0] * (width - len(i)) + [1] * len(i) for i in ids])
    with torch.no_grad():
        out = model.generate(input_ids=inputs, attention_mask=mask, do_sample=False, max_new_tokens=4)
    texts = tok.batch_decode(out[:, width:], skip_special_tokens=True)
    return sum(task.reward(t, p) for t, p in zip(texts, prompts)) / n


# --- tokenizer ---------------------------------------------------------------------------------------------


def test_tokenizer_one_id_per_char_in_vocab_order():
    tok = build_tokenizer()
    assert len(tok) == CHAR_VOCAB_SIZE
    assert (tok.pad_token, tok.eos_token, tok.bos_token) == (PAD, EOS, BOS)
    assert (tok.pad_token_id, tok.eos_token_id, tok.bos_token_id) == tuple(
        CHAR_VOCAB.index(t) for t in (PAD, EOS, BOS)
    )
    for i, ch in enumerate(CHAR_VOCAB):
        assert tok.encode(ch) == [i], ch


def test_tokenizer_round_trip_without_added_specials():
    tok = build_tokenizer()
    ids = tok.encode("12+7=")
    assert ids == [CHAR_VOCAB.index(c) for c in "12+7="]
    for text in ["12+7=19", "abcd>dcba", "  two  spaces ", "x=(1, 2); y='z'!"]:
        assert tok.decode(tok.encode(text), skip_special_tokens=True) == text
    assert (
        tok.decode(tok.encode("19") + [tok.eos_token_id, tok.pad_token_id], skip_special_tokens=True) == "19"
    )
    assert tok.encode("9<eos>") == [CHAR_VOCAB.index("9"), tok.eos_token_id]


# --- config ------------------------------------------------------------------------------------------------


def test_hf_config_from_presets():
    tiny = hf_config(ModelConfig(), CHAR_VOCAB_SIZE)
    assert tiny.vocab_size == CHAR_VOCAB_SIZE
    assert (tiny.pad_token_id, tiny.eos_token_id, tiny.bos_token_id) == (0, 1, 2)
    assert tiny.num_hidden_layers == 2 and tiny.num_key_value_heads == 2 and tiny.tie_word_embeddings
    big = hf_config(ModelConfig(name="big", vocab_size=151936, hidden_size=128, num_heads=4), CHAR_VOCAB_SIZE)
    assert big.vocab_size == 151936
    with pytest.raises(ValueError, match="vocab_size"):
        hf_config(ModelConfig(vocab_size=10), CHAR_VOCAB_SIZE)
    with pytest.raises(ValueError, match="divide"):
        hf_config(ModelConfig(num_heads=3), CHAR_VOCAB_SIZE)


def test_tiny_model_has_about_100k_params_with_qwen2_biases():
    model = AutoModelForCausalLM.from_config(hf_config(ModelConfig(), CHAR_VOCAB_SIZE))
    n = sum(p.numel() for p in model.parameters())
    assert 50_000 < n < 150_000, n
    attn = model.model.layers[0].self_attn
    assert attn.q_proj.bias is not None and attn.o_proj.bias is None


def test_cache_key_tracks_what_changes_weights(tmp_path):
    base = cache_key(run_cfg(tmp_path, steps=5))
    assert base.startswith("tiny-")
    assert base == cache_key(run_cfg(tmp_path, steps=5))
    assert base != cache_key(run_cfg(tmp_path, steps=6))
    assert base != cache_key(run_cfg(tmp_path, steps=5, seed=1))
    assert base != cache_key(run_cfg(tmp_path, steps=5, kind=TaskKind.reverse))
    # without a warm start the task does not touch the weights
    assert cache_key(run_cfg(tmp_path)) == cache_key(run_cfg(tmp_path, kind=TaskKind.reverse))


# --- prepare_model -----------------------------------------------------------------------------------------


def test_prepare_model_returns_given_path_unchanged(tmp_path):
    cfg = run_cfg(tmp_path)
    cfg.model.path = "Qwen/Qwen2.5-0.5B"
    assert prepare_model(cfg) == "Qwen/Qwen2.5-0.5B"
    assert not (tmp_path / "models").exists()


def test_prepare_model_builds_loadable_folder_and_caches(tmp_path):
    cfg = run_cfg(tmp_path, steps=3)
    path = prepare_model(cfg)
    files = {p.name for p in Path(path).iterdir()}
    assert {"config.json", "model.safetensors", "tokenizer.json", "generation_config.json"} <= files
    gen = json.loads((Path(path) / "generation_config.json").read_text())
    assert (gen["eos_token_id"], gen["pad_token_id"]) == (1, 0)

    model = AutoModelForCausalLM.from_pretrained(path)
    tok = AutoTokenizer.from_pretrained(path)
    assert tok.encode("3+4=") == build_tokenizer().encode("3+4=")
    out = model.generate(torch.tensor([tok.encode("3+4=")]), do_sample=False, max_new_tokens=3)
    assert out.shape[1] > 4

    mtime = (Path(path) / "model.safetensors").stat().st_mtime_ns
    start = time.perf_counter()
    assert prepare_model(cfg) == path
    assert time.perf_counter() - start < 0.5
    assert (Path(path) / "model.safetensors").stat().st_mtime_ns == mtime
    assert built_models(tmp_path) == [Path(path)]


def test_prepare_model_is_seeded(tmp_path):
    a = AutoModelForCausalLM.from_pretrained(prepare_model(run_cfg(tmp_path / "a")))
    b = AutoModelForCausalLM.from_pretrained(prepare_model(run_cfg(tmp_path / "b")))
    c = AutoModelForCausalLM.from_pretrained(prepare_model(run_cfg(tmp_path / "c", seed=1)))
    emb = [m.get_input_embeddings().weight for m in (a, b, c)]
    assert torch.equal(emb[0], emb[1])
    assert not torch.equal(emb[0], emb[2])


def test_concurrent_builders_share_one_folder(tmp_path, monkeypatch):
    real_build, builds = models._build, []

    def slow_build(*args):
        builds.append(1)
        time.sleep(0.2)  # long enough for every thread to arrive while the first one builds
        return real_build(*args)

    monkeypatch.setattr(models, "_build", slow_build)
    cfg = run_cfg(tmp_path)
    paths: list[str] = []
    threads = [threading.Thread(target=lambda: paths.append(prepare_model(cfg))) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(paths) == 3 and len(set(paths)) == 1
    assert len(builds) == 1
    assert built_models(tmp_path) == [Path(paths[0])]  # no temp folders left behind


def test_warm_start_learns_arith(tmp_path):
    task_cfg = TaskConfig(kind=TaskKind.arith)
    task = build_task(task_cfg)
    untrained = greedy_accuracy(prepare_model(run_cfg(tmp_path)), task)
    trained = greedy_accuracy(prepare_model(run_cfg(tmp_path, steps=150)), task)
    assert untrained < 0.05
    assert trained >= 0.1 and trained > untrained + 0.05, (untrained, trained)
