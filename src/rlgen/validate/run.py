"""`rlgen validate engine=<kind>`: property-based equivalence of an engine against the hf reference.

Hypothesis draws batches of requests; the candidate generates, the hf reference scores the same tokens
teacher-forced, and the logprobs are compared with the training metrics (k3 KL, |Δlogp|); greedy sequences must
agree up to near-ties. The run passes when every row is within ``validate.kl_tolerance``; the report goes to
``validate.json`` and the exit code is 1 on FAIL. The cases come from ``rlgen.validate.cases``, the rows from
``rlgen.validate.compare``, the engines' hosts from ``rlgen.validate.engines``. docs/correctness.md
("rlgen validate") has the cases, the tolerances and the CPU candidate.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
from pathlib import Path
from typing import Any

from rlgen.config import Perturb, RunConfig, Runner, ValidateConfig, set_key, to_run_config
from rlgen.engines.contract import ScoresTokens, has, require
from rlgen.engines.registry import engine_spec
from rlgen.models import load_tokenizer, prepare_model
from rlgen.plan import build_plan
from rlgen.validate.cases import DrawnRequest, draw_cases, prompt_length
from rlgen.validate.compare import CheckRow, ValidationReport, compare, jsonable
from rlgen.validate.engines import InActor, InProcess, perturbed_hf_engine_cls
from rlgen.validate.lora import give_policy, refuse_on_a_server


def _candidate_spec(cfg: RunConfig, v: ValidateConfig, plan, engine_cls, engine_kwargs) -> tuple[type, dict, str]:
    """(class, extra constructor kwargs, description) of the engine under test."""
    if engine_cls is not None:
        kwargs = dict(engine_kwargs or {})
        extra = ", ".join(f"{k}={val}" for k, val in kwargs.items())
        return engine_cls, kwargs, f"{engine_cls.__name__}({extra})" if extra else engine_cls.__name__
    spec = plan.engine
    if spec.reference:  # the reference against itself: its weights rounded through validate.perturb
        perturb = Perturb(v.perturb)
        what = "unchanged" if perturb is Perturb.none else f"rounded to {perturb.value}"
        return (perturbed_hf_engine_cls(), {"perturb": perturb.value},
                f"{spec.kind} {cfg.engine.dtype}, weights {what}")
    # the engine as a run makes it, less the weight transfer channel (validate sends weights, if any, directly)
    kwargs = dict(spec.actor_kwargs(cfg, plan.transport, dict(plan.engine_env)))
    if "engine_args" in kwargs:
        kwargs["engine_args"] = {k: val for k, val in kwargs["engine_args"].items() if k != "weight_transfer_config"}
        if not kwargs["engine_args"]:
            del kwargs["engine_args"]
    where = f"engine 0 of the server at {cfg.engine.url}" if spec.served else f"{spec.kind} {cfg.engine.dtype}"
    return spec.actor_class(), kwargs, where


def run_validate(
    cfg: RunConfig,
    v: ValidateConfig | None = None,
    *,
    out_dir: str | Path | None = None,
    console=None,
    engine_cls: type | None = None,
    engine_kwargs: dict[str, Any] | None = None,
) -> ValidationReport:
    """Compare the candidate engine of ``cfg.engine`` (or ``engine_cls(..., **engine_kwargs)``, which stands in
    for that kind and answers what its spec claims) with the hf reference on hypothesis-drawn cases. Prints the
    table when ``console`` is given and writes ``validate.json`` to ``out_dir`` when given."""
    from rlgen.engines.hf.engine import HFEngine

    v = v or getattr(cfg, "validate", None) or ValidateConfig()
    start = time.time()
    if prompt_length(v):  # the engine and the model sized for prompts of that many tokens and their responses
        cfg = set_key(set_key(cfg, "task.max_prompt_tokens", prompt_length(v)), "algo.max_new_tokens", v.max_new_tokens)
    plan = build_plan(cfg)
    refuse_on_a_server(plan)
    cfg = plan.config
    device = "cuda" if plan.device == "cuda" else "cpu"
    model_path = prepare_model(cfg, device=device)
    tok = load_tokenizer(model_path)
    vocab = min(len(tok), cfg.model.vocab_size or len(tok))
    stop_ids = (tok.eos_token_id,) if tok.eos_token_id is not None else ()
    cases = draw_cases(v, vocab, set(tok.all_special_ids))

    ref_engine = dataclasses.replace(cfg.engine, kind="hf", dtype=v.reference_dtype)
    require(engine_spec(ref_engine.kind), ScoresTokens, "rlgen validate's reference")
    reference = InProcess(HFEngine, (model_path, ref_engine), {"device": device, "seed": cfg.seed, "name": "reference", "threads": None})
    cls, extra, description = _candidate_spec(cfg, v, plan, engine_cls, engine_kwargs)
    cand_engine = dataclasses.replace(
        cfg.engine, gpu_memory_utilization=min(cfg.engine.gpu_memory_utilization or 1.0, v.gpu_memory_utilization)
    )
    runner = Runner(v.runner)
    if runner is Runner.auto:
        runner = Runner.local if plan.engine.runs_on("cpu") else Runner.ray  # vLLM needs an actor of its own
    kwargs = {"device": device, "seed": cfg.seed, "name": "candidate", **extra}
    if runner is Runner.ray:
        gpus = float(cfg.engine.tensor_parallel_size) if device == "cuda" else 0.0
        candidate: Any = InActor(cls, (model_path, cand_engine), kwargs, gpus, cfg.timeout_s)
    else:
        if issubclass(cls, HFEngine):
            kwargs["threads"] = None  # leave torch's thread count in this process alone
        candidate = InProcess(cls, (model_path, cand_engine), kwargs)
    undo = None
    try:
        lora, undo = give_policy(plan, model_path, device, reference, candidate)
        if lora:
            description = f"{description}, {lora}"
        rows, summaries = compare(reference, candidate, cases, v, stop_ids, cfg.monitor.delta_threshold,
                                  can_score=has(plan.engine, ScoresTokens))
    finally:
        try:
            if undo is not None:
                undo()
        finally:
            candidate.close()
        reference.close()
    worst = max(summaries, key=lambda s: (not math.isfinite(s["k3_kl"]), s["k3_kl"]), default=None)
    report = ValidationReport(
        engine=cfg.engine.kind,
        candidate=description,
        reference=f"hf {v.reference_dtype}",
        device=device,
        settings=jsonable(dataclasses.asdict(v)) | {"model": cfg.model.name, "model_path": model_path},
        rows=rows,
        cases=summaries,
        worst_case=worst,
        passed=all(r.passed for r in rows),
        seconds=time.time() - start,
    )
    if console is not None:
        print_report(report, console)
    if out_dir is not None:
        path = Path(out_dir) / "validate.json"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(report.to_dict(), indent=2) + "\n")
        if console is not None:
            console.print(f"report: {path}", highlight=False)
    return report


def print_report(report: ValidationReport, console) -> None:
    from rich import box
    from rich.table import Table

    table = Table(
        title=f"rlgen validate: {report.candidate} vs {report.reference} ({report.device}, {len(report.cases)} cases)",
        caption="tolerance: k3 KL at most the first number; greedy agreement at least the second",
        box=box.SIMPLE_HEAD,
        pad_edge=False,
        padding=(0, 0, 0, 1),
    )
    for col in ("check", "tokens", "k3 KL", "tolerance", "mean|Δ|", "max|Δ|", "greedy", "result"):
        table.add_column(col, justify="left" if col == "check" else "right")
    for r in report.rows:
        greedy = "-" if r.greedy_agreement is None else f"{r.greedy_agreement:.2f}"
        verdict = "[green]PASS[/]" if r.passed else "[bold red]FAIL[/]"
        table.add_row(
            r.name, str(r.tokens), f"{r.k3_kl:.1e}", r.tolerance, f"{r.mean_abs_delta:.1e}",
            f"{r.max_abs_delta:.1e}", greedy, verdict,
        )
    console.print(table)
    n = len(report.cases)
    perturb = report.settings.get("perturb", "none")
    if perturb != Perturb.none.value and "weights rounded" in report.candidate:
        console.print(
            f"engine={report.engine}: the candidate is the reference with its weights rounded to {perturb}, a deliberately "
            "perturbed precision that shows the check can fail; validate.perturb=none compares hf with itself.",
            highlight=False,
        )
    if report.passed:
        console.print(f"[green]PASS[/]: {n} cases agree with the reference ({report.seconds:.1f} s).", highlight=False)
    else:
        w = report.worst_case or {}
        console.print(
            f"[bold red]FAIL[/]: {n} cases; worst is case {w.get('case')} (k3 KL {w.get('k3_kl', math.nan):.3g}, "
            f"max |Δlogp| {w.get('max_abs_delta', math.nan):.3g}); every case is in validate.json.",
            highlight=False,
        )


def split_config(dict_cfg) -> tuple[RunConfig, ValidateConfig]:
    """The composed Hydra config -> (RunConfig, ValidateConfig); the ``validate`` node is optional."""
    from omegaconf import OmegaConf

    node = OmegaConf.to_container(dict_cfg, resolve=True)
    v_node = node.pop("validate", None) or {}
    v = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(ValidateConfig), v_node))
    return to_run_config(OmegaConf.create(node)), v


__all__ = [
    "CheckRow",
    "DrawnRequest",
    "Perturb",
    "ValidateConfig",
    "ValidationReport",
    "compare",
    "draw_cases",
    "print_report",
    "run_validate",
    "split_config",
]
