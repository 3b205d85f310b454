"""Local models: the character tokenizer, Qwen2 configs from presets, and cached builds with a warm start.

``prepare_model`` returns a plain Hugging Face folder, so every engine and learner loads the same weights with
``from_pretrained`` whether they came from the hub, a user's folder, or a local build.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import importlib
import json
import logging
import os
import shutil
import tempfile
import time
from enum import Enum
from importlib.metadata import version
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rlgen.charvocab import BOS, CHAR_VOCAB, EOS, PAD, SPECIAL_TOKENS
from rlgen.config import ModelConfig, RunConfig
from rlgen.durable import exclusive_lock
from rlgen.rope import rope_parameters
from rlgen.tasks import build_task

if TYPE_CHECKING:
    import torch
    from transformers import PreTrainedModel, PreTrainedTokenizerFast, Qwen2Config

    from rlgen.tasks import Prompt, Task

log = logging.getLogger(__name__)

# Bump when the build or warm-start recipe changes, so old caches are not reused.
BUILD_FORMAT = 1
WARM_START_BATCH = 64
SHAPE_SEED = 0  # draws the weights of presets whose seed is not theirs (seeded()): the same for every run


def build_tokenizer() -> PreTrainedTokenizerFast:
    """One token per character of CHAR_VOCAB, ids in vocabulary order; encode adds no special tokens.

    Characters outside the vocabulary encode as the pad token (and so vanish when decoding with
    ``skip_special_tokens=True``).
    """
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {ch: i for i, ch in enumerate(CHAR_VOCAB)}
    core = Tokenizer(models.WordLevel(vocab, unk_token=PAD))
    core.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    core.decoder = decoders.Fuse()
    core.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])
    return PreTrainedTokenizerFast(
        tokenizer_object=core,
        pad_token=PAD,
        eos_token=EOS,
        bos_token=BOS,
        clean_up_tokenization_spaces=False,
    )


TOKENIZER_CLASS = "rlgen_tokenizer.json"  # in a built folder: the class AutoTokenizer loads its tokenizer with


def load_tokenizer(path: str | os.PathLike[str], note: bool = False) -> PreTrainedTokenizerFast:
    """The folder's tokenizer as AutoTokenizer loads it. A folder that names that class (tokenizer_class_of: the
    preset builds) is loaded by the class directly, the same tokenizer without AutoTokenizer's imports, which
    bring in transformers' configuration and generation code (and with it torch._dynamo and scikit-learn):
    12-14 s on a GPU host against 6-7 s. note: name the class in the folder where it does not yet (a build)."""
    named = tokenizer_class_of(path)
    if named is not None:
        cls = getattr(importlib.import_module(named[0]), named[1], None)
        if cls is not None:
            return cls.from_pretrained(str(path), _from_auto=True)
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(str(path))
    if note:
        note_tokenizer_class(path, type(tok))
    return tok


def tokenizer_class_of(path: str | os.PathLike[str] | None) -> tuple[str, str] | None:
    """(module, class) that a built folder names for its tokenizer, where the transformers installed is the one
    that named it; None where it names none (AutoTokenizer then picks)."""
    if not path:
        return None
    try:
        data = json.loads((Path(path) / TOKENIZER_CLASS).read_text())
        module, name, made_by = data["module"], data["class"], data["transformers"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    ok = isinstance(module, str) and module.startswith("transformers.") and isinstance(name, str)
    return (module, name) if ok and made_by == version("transformers") else None


def note_tokenizer_class(path: str | os.PathLike[str], cls: type) -> None:
    """Name in the folder the class AutoTokenizer loaded its tokenizer with (one of transformers' own only)."""
    if not cls.__module__.startswith("transformers."):
        return
    target = Path(path) / TOKENIZER_CLASS
    tmp = target.with_name(f".{target.name}.{os.getpid()}")
    try:
        tmp.write_text(json.dumps({"module": cls.__module__, "class": cls.__qualname__,
                                   "transformers": version("transformers")}))
        os.replace(tmp, target)
    except OSError:  # a folder this process may not write: AutoTokenizer picks each time
        with contextlib.suppress(OSError):
            tmp.unlink()


def hf_config(m: ModelConfig, vocab_size: int) -> Qwen2Config:
    """A Qwen2 config from a preset; ``vocab_size`` (the tokenizer's) applies when the preset gives 0."""
    from transformers import Qwen2Config

    vocab = m.vocab_size or vocab_size
    if vocab < vocab_size:
        raise ValueError(
            f"model.vocab_size={m.vocab_size} is smaller than the tokenizer's {vocab_size} tokens; "
            "set it to 0 to use the tokenizer's size."
        )
    if m.num_heads % m.num_kv_heads or m.hidden_size % m.num_heads:
        raise ValueError(
            f"model {m.name}: hidden_size={m.hidden_size}, num_heads={m.num_heads} and "
            f"num_kv_heads={m.num_kv_heads} must divide evenly (hidden by heads, heads by kv heads)."
        )
    return Qwen2Config(
        vocab_size=vocab,
        hidden_size=m.hidden_size,
        intermediate_size=m.intermediate_size,
        num_hidden_layers=m.num_layers,
        num_attention_heads=m.num_heads,
        num_key_value_heads=m.num_kv_heads,
        max_position_embeddings=m.max_position_embeddings,
        tie_word_embeddings=m.tie_word_embeddings,
        rope_parameters=rope_parameters(m.rope_theta, m.max_position_embeddings, m.yarn_factor),
        pad_token_id=CHAR_VOCAB.index(PAD),
        eos_token_id=CHAR_VOCAB.index(EOS),
        bos_token_id=CHAR_VOCAB.index(BOS),
    )


def _plain(obj: Any) -> Any:
    if isinstance(obj, Enum):
        return obj.value
    if dataclasses.is_dataclass(obj):
        return {f.name: _plain(getattr(obj, f.name)) for f in dataclasses.fields(obj)}
    return obj


def file_digest(path: str) -> str:
    h = hashlib.sha256()
    with open(Path(path).expanduser(), "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def _build_device(m: ModelConfig, device: str) -> str:
    """Where a preset is built: on the run's GPU when it has a full vocabulary or a warm start (seconds there,
    minutes on a CPU); otherwise on CPU (fast, and the same weights on every machine)."""
    on_gpu = str(device).startswith("cuda") and (m.vocab_size > 0 or m.warm_start_steps > 0)
    return str(device) if on_gpu else "cpu"


def seeded(m: ModelConfig) -> bool:
    """Whether ``seed`` draws a preset's weights. A preset with the full vocabulary and no warm start stands in for
    a pretrained checkpoint: its random weights are the shape's alone (drawn with SHAPE_SEED), so every run on a
    host starts from one folder whatever its seed, and a new seed does not build another. Small presets (the
    character vocabulary, built in seconds) and warm starts (trained on the task's demonstrations) keep theirs."""
    return m.vocab_size <= 0 or m.warm_start_steps > 0


def cache_key(cfg: RunConfig, device: str = "cpu") -> str:
    """``<name>-<hash>`` over everything that changes the built weights. Reads the transformers version without
    importing it (seconds on a GPU host), so a cached build is found at once."""

    material: dict[str, Any] = {
        "format": BUILD_FORMAT,
        "model": _plain(cfg.model),
        "transformers": version("transformers"),
        "device": _build_device(cfg.model, device).split(":")[0],  # cuda and cpu draw different init
    }
    if seeded(cfg.model):
        material["seed"] = cfg.seed
    if cfg.model.warm_start_steps > 0:
        material["task"] = _plain(cfg.task)
        if cfg.task.path:
            material["task_file"] = file_digest(cfg.task.path)
    digest = hashlib.sha256(json.dumps(material, sort_keys=True).encode()).hexdigest()[:12]
    return f"{cfg.model.name}-{digest}"


def _batch(tok: PreTrainedTokenizerFast, demos: list[Prompt]) -> dict[str, torch.Tensor]:
    """Right-padded prompt + answer + eos; labels only on the answer and eos."""
    import torch

    rows, labels = [], []
    for d in demos:
        p, a = tok.encode(d.text), tok.encode(d.answer) + [tok.eos_token_id]
        rows.append(p + a)
        labels.append([-100] * len(p) + a)
    width = max(len(r) for r in rows)
    ids = torch.full((len(rows), width), tok.pad_token_id, dtype=torch.long)
    lab = torch.full((len(rows), width), -100, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, (r, y) in enumerate(zip(rows, labels)):
        ids[i, : len(r)] = torch.tensor(r)
        lab[i, : len(y)] = torch.tensor(y)
        mask[i, : len(r)] = 1
    return {"input_ids": ids, "attention_mask": mask, "labels": lab}


def warm_start(
    model: PreTrainedModel, tok: PreTrainedTokenizerFast, task: Task, steps: int, lr: float, seed: int
) -> float:
    """Supervised steps on the task's demonstrations; returns the last step's loss."""
    import torch

    demos = task.demonstrations(steps * WARM_START_BATCH, seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr)
    device = next(model.parameters()).device
    model.train()
    loss = torch.tensor(float("nan"))
    for step in range(steps):
        chunk = demos[step * WARM_START_BATCH : (step + 1) * WARM_START_BATCH]
        batch = {k: v.to(device) for k, v in _batch(tok, chunk).items()}
        loss = model(**batch).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
    model.eval()
    return loss.item()


def _build(cfg: RunConfig, out: Path, device: str) -> str:
    """Write the model and tokenizer into ``out``; returns a short note for the build log line."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    tok = build_tokenizer()
    tok.model_max_length = cfg.model.max_position_embeddings
    config = hf_config(cfg.model, len(tok))
    big = cfg.model.vocab_size > 0
    note = "random init"
    with torch.random.fork_rng(devices=[] if device == "cpu" else None):
        torch.manual_seed(cfg.seed if seeded(cfg.model) else SHAPE_SEED)
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16 if big else torch.float32)
        if cfg.model.warm_start_steps > 0:

            task = build_task(cfg.task)
            steps, lr = cfg.model.warm_start_steps, cfg.model.warm_start_lr
            loss = warm_start(model, tok, task, steps, lr, cfg.seed)
            note = f"{steps} warm-start steps on {task.name}, final loss {loss:.3f}"
    model.generation_config = GenerationConfig(
        eos_token_id=tok.eos_token_id, pad_token_id=tok.pad_token_id, bos_token_id=tok.bos_token_id
    )
    model.save_pretrained(out)
    tok.save_pretrained(out)
    load_tokenizer(out, note=True)  # the class AutoTokenizer gives the folder, named in it
    del model
    if device != "cpu":  # the driver keeps running beside the actors: give the GPU memory back (15 GiB for 7B)
        torch.cuda.empty_cache()
    return note


PRESET_ARCHITECTURES = ["Qwen2ForCausalLM"]  # what every preset builds (hf_config)


def architectures(m: ModelConfig) -> list[str]:
    """The model classes config.json names: the model folder's, or the presets' when the folder is built here."""
    if not m.path:
        return list(PRESET_ARCHITECTURES)
    try:
        value = json.loads((Path(m.path) / "config.json").read_text()).get("architectures")
    except (OSError, ValueError):
        return []
    return [str(a) for a in value] if isinstance(value, list) else []


def build_folder(cfg: RunConfig, device: str = "cpu") -> Path:
    """Where the preset's build is kept (under cache_dir, by cache_key), whether it exists yet or not. A build
    appears there whole: prepare_model renames the finished folder into place."""
    return Path(cfg.cache_dir).expanduser() / "models" / cache_key(cfg, device)


def built_model(cfg: RunConfig, device: str = "cpu") -> str | None:
    """``cfg.model.path``, or the preset's cached build where it exists: a folder found without importing torch or
    transformers (None: prepare_model must build it)."""
    if cfg.model.path:
        return cfg.model.path
    final = build_folder(cfg, device)
    return str(final) if final.is_dir() else None


def prepare_model(cfg: RunConfig, device: str = "cpu") -> str:
    """The path of a Hugging Face model folder for ``cfg.model``: ``cfg.model.path`` as given, or a cached
    local build from the preset (random init seeded by ``cfg.seed`` where it is the preset's, seeded(); then the
    optional warm start)."""
    ready = built_model(cfg, device)
    if ready is not None:
        return ready
    final = build_folder(cfg, device)
    root = final.parent
    root.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(root / f".{final.name}.lock"):
        if final.is_dir():  # another process built it while this one waited
            return str(final)
        start = time.perf_counter()
        tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}-", dir=root))
        tmp.chmod(0o755)  # mkdtemp makes it private; the finished folder is an ordinary one
        try:
            note = _build(cfg, tmp, _build_device(cfg.model, device))
            os.rename(tmp, final)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    log.info("built model %s in %.1fs (%s)", final, time.perf_counter() - start, note)
    return str(final)


__all__ = ["PRESET_ARCHITECTURES", "SHAPE_SEED", "TOKENIZER_CLASS", "architectures", "build_folder", "build_tokenizer",
           "built_model", "cache_key", "hf_config", "load_tokenizer", "note_tokenizer_class", "prepare_model", "seeded",
           "tokenizer_class_of", "warm_start"]
