"""Checks of what a run reads and writes, before anything starts: the model folder, every prompt of the task
(encodable, not empty, within task.max_prompt_tokens), the reward function, and the output and cache
directories. Each problem is one sentence with its fix."""

from __future__ import annotations

import json
import os
import re
import tempfile
from pathlib import Path

from rlgen.charvocab import CHAR_VOCAB
from rlgen.config import RunConfig, TaskKind
from rlgen.tasks import build_task
from rlgen.tasks.base import TaskDataError
from rlgen.tasks.dataset import DatasetTask, read_dataset
from rlgen.tasks.jsonl import read_rows
from rlgen.tasks.prompts import PromptRenderer
from rlgen.tasks.rewards import RewardSpecError

WEIGHT_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin", "pytorch_model.bin.index.json")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json")
MAX_SHOWN = 5  # bad rows named one by one; the rest are counted
CHARS_PER_TOKEN_CAP = 64  # a prompt longer than this many characters per allowed token is too long untokenized
HUB_ID = re.compile(r"[A-Za-z0-9][\w.-]*/[\w.-]+")


# -- the model folder -------------------------------------------------------------------------------------
def check_model(cfg: RunConfig, problems: list[str]) -> None:
    path = cfg.model.path
    if not path:
        return
    p = Path(path).expanduser()
    if p.is_file():
        problems.append(f"model.path={path} is a file; it must be a Hugging Face model folder (config.json, "
                        "weights and tokenizer files, as save_pretrained writes them).")
    elif p.is_dir():
        _check_folder(path, p, problems)
    elif HUB_ID.fullmatch(path) and not path.startswith((".", "~")):
        _check_hub_id(path, problems)
    else:
        problems.append(f"model.path={path} does not exist; give a local Hugging Face model folder, or a hub id "
                        "such as Qwen/Qwen2.5-0.5B-Instruct.")


def _check_folder(path: str, p: Path, problems: list[str]) -> None:
    config = p / "config.json"
    if not config.is_file() and (p / "adapter_config.json").is_file():
        problems.append(f"model.path={path} is a LoRA adapter folder, not a model; point model.path at its base "
                        f"model and set learner.lora.init={path} (or use its merged/ folder).")
        return
    if not config.is_file():
        problems.append(f"model.path={path} has no config.json, so it is not a Hugging Face model folder; point it "
                        "at the folder save_pretrained wrote (or a downloaded snapshot).")
        return
    try:
        json.loads(config.read_text())
    except (OSError, ValueError) as err:
        problems.append(f"model.path={path}: config.json cannot be read ({err}); re-save the model.")
    if not any((p / f).is_file() for f in WEIGHT_FILES) and not list(p.glob("*.safetensors")):
        problems.append(f"model.path={path} holds no weights (model.safetensors or pytorch_model.bin); save the "
                        "model with save_pretrained, or download its weights into the folder.")
    if not any((p / f).is_file() for f in TOKENIZER_FILES):
        problems.append(f"model.path={path} holds no tokenizer (tokenizer.json or tokenizer_config.json); save "
                        "the tokenizer into the same folder (tokenizer.save_pretrained).")


def hub_snapshot(repo: str) -> str | None:
    """The local snapshot of a hub model in the Hugging Face cache, or None."""
    try:
        from huggingface_hub import snapshot_download

        return snapshot_download(repo, local_files_only=True)
    except Exception:  # noqa: BLE001 - not cached (or no huggingface_hub): None
        return None


def _check_hub_id(repo: str, problems: list[str]) -> None:
    if hub_snapshot(repo):
        return
    fix = (f"download it where there is network (huggingface-cli download {repo} --local-dir DIR) and set "
           "model.path=DIR")
    if os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes"):
        problems.append(f"model.path={repo} is not a local folder nor in the Hugging Face cache, and HF_HUB_OFFLINE "
                        f"is set; {fix}.")
        return
    try:
        from huggingface_hub import HfApi
        from huggingface_hub.errors import RepositoryNotFoundError

        HfApi().model_info(repo, timeout=5)
    except RepositoryNotFoundError:
        problems.append(f"model.path={repo}: there is no such model on the Hugging Face hub (or it is private); "
                        "check the id, or give a local folder.")
    except Exception as err:  # noqa: BLE001 - any network failure: the hub cannot be reached from here
        problems.append(f"model.path={repo} is not a local folder nor in the Hugging Face cache, and the hub cannot "
                        f"be reached ({type(err).__name__}); {fix}.")


# -- prompts ----------------------------------------------------------------------------------------------
class CharTokenizer:
    """The presets' character tokenizer, as far as measuring prompts goes, without transformers: encode
    gives one id per character, -1 for a character it cannot encode."""

    chat_template = None
    eos_token_id = None

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        index = {ch: i for i, ch in enumerate(CHAR_VOCAB)}
        return [index.get(ch, -1) for ch in text]


class PromptEncoder:
    """Measures prompts as the run will render them (rlgen.tasks.prompts.PromptRenderer: chat template, system
    prompt), with the preset's character tokenizer or the tokenizer of model.path, without building a model."""

    def __init__(self, cfg: RunConfig):
        self.path = cfg.model.path
        if self.path:
            folder = Path(self.path).expanduser()
            if not folder.is_dir():
                folder = Path(hub_snapshot(self.path) or folder)
            if not folder.is_dir():  # never the network: check_model has said what is wrong with model.path
                raise FileNotFoundError(f"{self.path} is not a local folder")
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(str(folder))
            self.name = f"the tokenizer of model.path={self.path}"
        else:
            tokenizer = CharTokenizer()
            self.name = "the preset's character tokenizer"
        self.renderer = PromptRenderer(tokenizer, cfg.task)

    def count(self, text: str) -> int:
        return len(self.renderer.ids(text))

    def unknown(self, text: str) -> str:
        """The characters of text the tokenizer cannot encode (the character tokenizer drops them silently)."""
        if not isinstance(self.renderer.tokenizer, CharTokenizer):
            return ""
        return "".join(sorted({ch for ch, i in zip(text, self.renderer.tokenizer.encode(text)) if i < 0}))


def check_prompts(prompts: list, cfg: RunConfig, encoder: PromptEncoder, problems: list[str], what: str) -> None:
    """Every prompt not empty, encodable, and (task.long_prompts=reject) within task.max_prompt_tokens; bad ones
    named by their row. Under skip and truncate the run leaves a long prompt out or cuts it, however long."""
    limit = cfg.task.max_prompt_tokens
    bad: list[str] = []
    system = cfg.task.system_prompt
    if system and (unknown := encoder.unknown(system + ("" if encoder.renderer.chat else "\n\n"))):
        shown = ", ".join(repr(c) for c in unknown[:8])
        problems.append(f"task.system_prompt has characters {encoder.name} cannot encode ({shown}); remove them, or "
                        "use model.path=<a model whose tokenizer has them>.")
        return
    reject = cfg.task.long_prompts.value == "reject"  # skip and truncate decide about a long prompt themselves
    for i, p in enumerate(prompts):
        where = p.source or f"{what} {i}"
        text = p.text
        if not text.strip():
            bad.append(f"{where}: the prompt is empty; every row needs a prompt.")
        elif reject and len(text) > limit * CHARS_PER_TOKEN_CAP:
            bad.append(f"{where}: the prompt is {len(text):,} characters long, far more than "
                       f"task.max_prompt_tokens={limit} tokens hold; shorten it or drop the row, or set "
                       "task.long_prompts=skip (leave such rows out) or truncate.")
        elif unknown := encoder.unknown(text):
            shown = ", ".join(repr(c) for c in unknown[:8])
            bad.append(f"{where}: the prompt has characters {encoder.name} cannot encode ({shown}); remove them, or "
                       "use model.path=<a model whose tokenizer has them>.")
        elif reject:
            n = encoder.count(text)
            if n > limit:
                bad.append(f"{where}: the prompt has {n} tokens, more than task.max_prompt_tokens={limit}; raise "
                           "task.max_prompt_tokens (and engine.max_model_len with it), shorten the prompt, or set "
                           "task.long_prompts=skip (leave such rows out) or truncate.")
    _extend(problems, bad, "prompts")


def check_task(cfg: RunConfig, problems: list[str], model_ok: bool = True) -> object | None:
    """Build the task (its data file read whole), check every prompt it can give and probe its reward.
    model_ok=False (model.path has problems of its own): prompts are not measured with its tokenizer.
    Returns the task, or None when it cannot be built."""

    t = cfg.task
    task = None
    if t.kind in (TaskKind.jsonl, TaskKind.dataset):
        if not t.path:
            return None  # the plan says what to set
        try:
            if t.kind == TaskKind.jsonl:
                _, bad = read_rows(t.path)
            else:

                rows, held, bad = read_dataset(t)
                task = None if bad else DatasetTask.from_rows(t, rows, held)
        except (TaskDataError, RewardSpecError) as err:
            problems.append(str(err))
            return None
        if bad:
            _extend(problems, bad, "rows")
            return None
    try:
        task = task or build_task(t)
    except (TaskDataError, RewardSpecError) as err:
        problems.append(str(err))
        return None
    if cfg.eval.every > 0 and not task.eval_prompts():
        problems.append(f"eval.every={cfg.eval.every} needs held-out prompts, and task={t.kind.value} has none; set "
                        "task.eval_path=<a file of held-out rows> or task.eval_fraction=0.05, or eval.every=0.")
    rows = getattr(task, "rows", None)
    try:
        sample = rows if rows is not None else [p for s in range(4) for p in task.prompts(s, cfg.algo.prompts_per_step)]
    except TaskDataError as err:  # an environment's draw() that fails
        problems.append(str(err))
        return None
    if model_ok:
        try:
            encoder = PromptEncoder(cfg)
        except TaskDataError as err:  # e.g. a chat format with no template
            problems.append(str(err))
        except Exception as err:  # noqa: BLE001 - a broken tokenizer file is reported, not raised
            problems.append(f"the tokenizer of model.path={cfg.model.path} cannot be loaded ({type(err).__name__}: "
                            f"{err}); re-save it with tokenizer.save_pretrained.")
        else:
            check_prompts(sample, cfg, encoder, problems, "row" if rows is not None else "prompt")
    if sample:
        probe_reward(task, sample[0], cfg.task.reward, problems)
    return task


def _extend(problems: list[str], bad: list[str], what: str) -> None:
    problems.extend(bad[:MAX_SHOWN])
    if len(bad) > MAX_SHOWN:
        problems.append(f"... and {len(bad) - MAX_SHOWN} more {what} like these ({len(bad)} in all).")


def probe_reward(task, prompt, name: str, problems: list[str]) -> None:
    """Score the first prompt's own answer and an empty completion: the reward must give a number for both."""
    for completion in (prompt.answer, ""):
        try:
            task.reward(completion, prompt)
        except Exception as err:  # noqa: BLE001 - whatever a user's function raises is reported
            problems.append(f"task.reward={name} fails on the first prompt ({prompt.text[:40]!r}) given the "
                            f"completion {completion[:40]!r}: {err}; it must return a number for any string.")
            return


# -- where the run writes -----------------------------------------------------------------------------------
def writable(path: Path) -> str | None:
    """None if a folder can be created at path and written to; else why not."""
    probe = path
    while not probe.exists():
        if probe.parent == probe:
            break
        probe = probe.parent
    if probe.exists() and not probe.is_dir():
        return f"{probe} is a file"
    try:
        with tempfile.TemporaryFile(dir=probe):
            pass
    except OSError as err:
        return f"{probe} is not writable ({err.strerror})"
    return None


def check_dirs(cfg: RunConfig, run_dir: Path | None, problems: list[str]) -> None:
    if run_dir is not None and (why := writable(run_dir)):
        problems.append(f"the run directory {run_dir} cannot be created: {why}; choose another with "
                        "hydra.run.dir=<folder> (hydra.sweep.dir for -m).")
    if not cfg.model.path:
        cache = Path(cfg.cache_dir).expanduser()
        if why := writable(cache):
            problems.append(f"cache_dir={cfg.cache_dir} cannot hold the built model: {why}; set "
                            "cache_dir=<a writable folder>.")


