"""Set-up's loaders: the algorithm, the starting model folder (and a distillation teacher's) and the task (with its
tokenizer, prompts and stop ids), each on a thread of its own beside the cluster's start, once the libraries they
share are imported whole.
``run`` is the Run being set up; each loader fills in its part of it."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from typing import TYPE_CHECKING

from rlgen.algo.registry import algorithm
from rlgen.config import RunConfig
from rlgen.models.build import built_model, load_tokenizer, prepare_model, tokenizer_class_of
from rlgen.runtime.start.on_thread import Beside
from rlgen.runtime.start.progress import StartupClock
from rlgen.runtime.start.teacher import check_teacher_tokenizer, teacher_folder
from rlgen.tasks import build_task, task_libraries
from rlgen.tasks.prompts import PromptRenderer, length_stop_ids, model_stop_ids

if TYPE_CHECKING:
    from rlgen.runtime.run_handle import Run
    from rlgen.tasks.base import Task


def start_loaders(run: Run) -> tuple[Beside[None], Beside[None], Beside[tuple[Task, PromptRenderer, list[int]]]]:
    """The algorithm, the model folder and the task, each loading on a thread of its own beside the cluster's
    start, once the libraries they share are imported (seconds on a GPU host)."""
    clock = run.services.clock or StartupClock(run.services.console)
    found = built_model(run.cfg, device=run.plan.device)  # None: this process builds the model folder
    # the tokenizer class a preset's build names (models.build.load_tokenizer); the task starts from that folder
    named = tokenizer_class_of(found) if found and run.built.resume is None else None
    libraries = Beside(_shared_libraries, run.cfg, found is None, named[0] if named else None)
    algo = Beside(_algorithm, run, libraries)
    model = Beside(_model, run, libraries, done=clock.begin("model folder"))
    task = Beside(_task, run, libraries, model, done=clock.begin("tokenizer and task"))
    return algo, model, task


SHARED_LIBRARIES = ("torch", "transformers")
# what the loaders reach for in transformers: its tokenizer base and, unless the model folder names its
# tokenizer's class (models.build.load_tokenizer), the Auto classes; where this process builds the model folder,
# its model base and Auto class too (nothing else here needs those)
TOKENIZER_NAMES = ("PreTrainedTokenizerBase", "AutoConfig", "AutoTokenizer")
MODEL_NAMES = ("PreTrainedModel", "AutoModelForCausalLM")
TRANSFORMERS_NAMES = TOKENIZER_NAMES + MODEL_NAMES


def _shared_libraries(cfg: RunConfig, builds: bool = True, tokenizer_module: str | None = None) -> None:
    """Import whole, on one thread, what set-up's loaders share, before they run side by side. A library that one
    thread is still importing looks broken to another: datasets, hashing a data set, found transformers half
    imported and without PreTrainedTokenizerBase. A library that is not installed is left to the code that needs
    it, which says how to install it. builds: the model folder is built here, so transformers' model side is
    needed too; a folder that is there already (kept, given, or cached) needs only the tokenizer's side, and
    only its tokenizer's module where the folder names its tokenizer's class (tokenizer_module), not the Auto
    classes."""

    for name in (*SHARED_LIBRARIES, *task_libraries(cfg.task)):
        if importlib.util.find_spec(name) is not None:
            importlib.import_module(name)
    transformers = sys.modules.get("transformers")
    if transformers is None:
        return
    named = tokenizer_module if not builds else None
    for name in TRANSFORMERS_NAMES if builds else TOKENIZER_NAMES[:1] if named else TOKENIZER_NAMES:
        getattr(transformers, name)
    if named:
        importlib.import_module(named)


def _after(libraries: Beside[None], run: Run) -> None:
    libraries.result(run.services.stop, "importing torch and transformers")


def _model(run: Run, libraries: Beside[None]) -> None:
    """The folders the actors load: the starting model (built and cached, or a checkpoint's). A folder already
    there is found at once, so the engines can be asked for as soon as the cluster is up; a build waits for the
    libraries it needs."""
    cfg = run.cfg
    path = built_model(cfg, device=run.plan.device)
    if path is None:  # a build (the libraries imported its model side: start_loaders saw no folder)
        _after(libraries, run)
        path = prepare_model(cfg, device=run.plan.device)
    run.built.initial_model_path = path
    # Actors start from the checkpoint's policy when resuming; the frozen reference stays the initial model.
    # With LoRA the checkpoint's model folder is an adapter: actors start from the base and the adapter comes after.
    lora = cfg.learner.lora.enabled
    run.built.start_model_path = str(run.built.resume.checkpoint / "model") if run.built.resume and not lora else run.built.initial_model_path
    run.built.teacher_path = teacher_folder(cfg, run.plan.device) or ""


def _algorithm(run: Run, libraries: Beside[None]) -> None:
    _after(libraries, run)

    run.built.algorithm = algorithm(run.cfg.algo)


def _task(run: Run, libraries: Beside[None], model: Beside[None]) -> tuple[Task, PromptRenderer, list[int]]:
    """The task, its prompts as the model's tokenizer renders them and the stop ids: what the loop needs, ready
    while the actors start (loading the tokenizer imports transformers, seconds on a GPU host)."""
    services = run.services
    built = run.built
    _after(libraries, run)

    cfg = run.cfg
    task = build_task(cfg.task)
    model.result(services.stop)
    built.tokenizer = load_tokenizer(built.start_model_path)
    if built.teacher_path:
        check_teacher_tokenizer(cfg.algo.teacher, built.teacher_path, built.tokenizer)
    renderer = PromptRenderer(built.tokenizer, cfg.task, tools=getattr(task, "tool_schemas", lambda: None)())
    if cfg.task.long_prompts.value == "skip" and hasattr(task, "keep_rows"):
        dropped = task.keep_rows(lambda p: renderer.fits(p.text))
        if dropped:
            services.console.print(f"left out {dropped} rows over task.max_prompt_tokens={cfg.task.max_prompt_tokens} "
                                   "(task.long_prompts=skip)", highlight=False)
    if hasattr(task, "rows"):
        services.console.print(f"task {task.name}: {len(task.rows)} rows, {len(task.eval_prompts())} held out; prompts "
                               f"as {renderer.format} text", highlight=False)
    stop_ids = model_stop_ids(built.start_model_path, built.tokenizer, cfg.task.stop_token_ids)
    built.pad_id = built.tokenizer.pad_token_id if built.tokenizer.pad_token_id is not None else (stop_ids or [0])[0]
    special = [built.pad_id, *stop_ids, *built.tokenizer.all_special_ids]
    stop_ids += length_stop_ids(run.plan.model.vocab_size, cfg.task.response_length_mean, cfg.task.seed, special)
    return task, renderer, stop_ids


__all__ = ["start_loaders"]
