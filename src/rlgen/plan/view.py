"""Render a Plan as rich tables."""

from __future__ import annotations

from typing import Any

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from rlgen.config import DistillEstimator
from rlgen.plan import GIB, Plan
from rlgen.plan.determinism import determinism_line
from rlgen.plan.layouts import LORA_ONLY, LayoutOption, faster_layout_line
from rlgen.plan.lengths import shaped_mean
from rlgen.plan.prediction import predict, print_prediction
from rlgen.plan.teacher import PLACE as TEACHER_PLACE


def _gpus(plan: Plan, gpus: tuple[int, ...] | int | None) -> str:
    if plan.device == "cpu" or gpus is None or gpus == ():
        return "cpu"
    if isinstance(gpus, int):
        return str(gpus)
    return ",".join(str(g) for g in gpus)


def memory_line(plan: Plan) -> str | None:
    """The memory split per GPU, in one line (None on CPU)."""
    m = plan.memory
    if m is None:
        return None
    learner = f"learner {m.learner_idle_gib:.1f} GiB between steps, {m.learner_peak_gib:.1f} GiB at its peak"
    if plan.config.learner.lora.enabled and m.learner_parts:
        learner += f" ({m.learner_parts})"
    if m.engine_fraction is None:
        return f"memory per GPU ({m.gpu_gib:.0f} GiB): {learner}"
    engine = f"vLLM gpu_memory_utilization {m.engine_fraction:.2f} ({m.engine_fraction * m.gpu_gib:.1f} GiB)"
    if m.engines_per_gpu > 1:
        engine += f" split between {m.engines_per_gpu} engines ({m.engine_fraction / m.engines_per_gpu:.3f} each)"
    if m.colocated and m.engine_awake:
        return (f"memory per GPU ({m.gpu_gib:.0f} GiB), shared: {engine}, awake throughout; {learner} (both fit "
                "at once: the engine generates the next batch while the learner trains)")
    if m.colocated:
        return (f"memory per GPU ({m.gpu_gib:.0f} GiB), shared: {engine} while generating; {learner} (the engine "
                "sleeps while the learner trains)")
    return f"memory per GPU ({m.gpu_gib:.0f} GiB): engine GPUs {engine}; learner GPUs {learner}"


def checkpoint_line(plan: Plan) -> str:
    """What the run writes to disk: a checkpoint's expected size and parts, how many the run writes and holds at
    once, and the rest of size (final_model/merged, a preset model to build); the most it needs under the run
    directory."""
    c, d = plan.config.checkpoint, plan.disk
    when = "in the background" if c.background else "while the run waits"
    written = ("one, at the end" if d.checkpoints == 1 else
               f"{d.checkpoints} (every {c.every} steps and at the end), up to {d.at_once} on disk at once (the "
               f"newest checkpoint.keep={c.keep} stay while the next is written)")
    line = (f"checkpoints: about {_gib(d.checkpoint_bytes / GIB)} each ({_gib(d.model_bytes / GIB)} of weights, "
            f"{_gib(d.learner_bytes / GIB)} of optimizer state), written {when}; the run writes {written}")
    if d.merged_bytes:
        line += f", and final_model/merged ({_gib(d.merged_bytes / GIB)})"
    line += f"; {_gib(d.run_dir_bytes / GIB)} under the run directory at the most"
    if d.build_bytes:
        line += f", and {_gib(d.build_bytes / GIB)} in cache_dir to build the model, unless built already"
    return line


def _gib(x: float) -> str:
    return f"{x:.1f} GiB" if x >= 0.1 else f"{x * 1024:.1f} MiB"


def partial_line(a: Any, async_steps: int) -> str:
    """What algo.partial_rollouts does, and the staleness it allows."""
    if not a.partial_rollouts:
        return "off (each step's generation runs until its longest response is done)"
    m = a.partial_max_steps
    return (f"{a.partial_rollouts:.0%} more groups in flight than a step trains; a group still running when the "
            f"step's are done is carried, at most {m} step{'s' if m > 1 else ''}, so a response's tokens may come from "
            f"policy versions up to {async_steps + m * (async_steps + 1)} behind the learner's")


def precision_line(plan: Plan) -> str:
    """What `precision` means for this plan's engines, learners and weights."""
    cfg = plan.config
    if plan.device != "cuda":
        return f"{cfg.precision}: on CPU engines and learners compute in float32"
    learner = ("fp16 with fp32 master weights and dynamic loss scaling (overflowing steps skipped and counted: "
               "overflow_skip)" if cfg.precision == "fp16" else
               "float32" if plan.learner_kind == "torch" else "bf16 with fp32 master weights")
    return f"{cfg.precision}: engines {cfg.engine.dtype}; learners {learner}; weights sent in {cfg.engine.dtype}"


def teacher_rows(plan: Plan) -> list[tuple[str, str]]:
    """On-policy distillation's rows for `rlgen plan`: the teacher, where it runs and its memory, the mix."""
    t, a = plan.teacher, plan.config.algo
    if t is None:
        return []
    what = f"the {t.source} preset" if t.preset else t.source
    size = 4 if plan.device == "cpu" else 2  # the CPU learner's float32, else the learner's half precision
    c = a.distill_coef
    alone = " (distillation alone; rewards are logged, not trained on)" if c == 1 else ""
    if DistillEstimator(a.distill_estimator) is DistillEstimator.full:
        return [("teacher", f"{what} ({t.params / 1e6:.1f}M params), frozen, in {TEACHER_PLACE}: "
                            f"{_gib(t.gib(size))} per learner rank; it forwards every micro-batch beside the policy"),
                ("distillation", f"A = {1 - c:g} A_task; the loss adds {c:g} sum_v pi (log pi - log pi_teacher) at "
                                 f"each response token (algo.distill_estimator=full){alone}")]
    return [("teacher", f"{what} ({t.params / 1e6:.1f}M params), frozen, in {TEACHER_PLACE}: "
                        f"{_gib(t.gib(size))} per learner rank; it scores every sampled token before the update"),
            ("distillation", f"A_t = {1 - c:g} A_task + {c:g} (log pi_teacher - log pi_engine) per response token"
                             f"{alone}")]


def algorithm_rows(a) -> list[tuple[str, str]]:
    """The resolved loss and advantage settings of algo config `a`, as (what, value) rows for `rlgen plan`."""
    ratio = "per sequence (geometric mean of its tokens')" if a.importance_level == "sequence" else "per token"
    level = 'per sequence' if a.tis_level == 'sequence' else 'per token'
    band = f"outside [{a.tis_low:g}, {a.tis_cap:g}]" if a.tis_mode == "mask" and a.tis_low > 0 else f"above {a.tis_cap:g}"
    is_fix = "off" if a.tis_cap <= 0 else f"{a.tis_mode} {level} {band}"
    if a.tis_cap > 0 and a.tis_seq_reject:
        is_fix += f"; sequences with a token outside [{a.tis_low:g}, {a.tis_cap:g}] rejected"
    if a.seq_mask_cap > 0:
        is_fix += f"; sequences with mean |log ratio| > log {a.seq_mask_cap:g} masked"
    kl = ("none" if a.kl_coef <= 0 else
          f"{a.kl_coef:g} x {a.kl_estimator} in the {a.kl_penalty}" + (", bias-corrected" if a.kl_bias_correction else ""))
    entropy = "none" if a.entropy_coef <= 0 else f"bonus {a.entropy_coef:g}"
    if a.entropy_top_frac < 1:
        entropy += f"; policy gradient on the top {a.entropy_top_frac:.0%} entropy tokens"
    scale = {"group": "group std", "batch": "batch std", "none": "not scaled"}[str(a.scale_rewards)]
    advantages = (f"reward - group mean, {scale}" + ("" if a.scale_rewards == "none" else f" ({a.reward_std})")
                  if a.advantage == "grpo" else f"{a.advantage} (docs/algorithms.md)")
    rows = [
        ("advantages", advantages),
        ("policy loss", f"{a.policy_loss}; pi_old: the {a.old_logprobs}'s logprobs"),
        ("ratio and clip", f"{ratio}, [1 - {a.clip_low:g}, 1 + {a.clip_high:g}]"),
        ("loss aggregation", str(a.loss_agg)),
        ("engine/trainer IS correction", is_fix),
        ("KL to the reference", kl),
        ("entropy", entropy),
        ("dynamic sampling", f"on, at most {a.max_gen_batches} generation rounds" if a.dynamic_sampling else "off"),
        ("overlong", (f"penalty up to {a.overlong_penalty:g} in the last {a.overlong_buffer} tokens"
                      if a.overlong_buffer else "no length penalty")
         + ("; truncated responses masked" if a.mask_truncated else "")),
    ]
    return rows


def resolved_lines(plan: Plan) -> list[str]:
    """One line per value the config left null, with what the plan chose and why."""
    return [f"{s.key}={s.value}  ({s.source})" for s in plan.settings if s.source != "config"]


def choice_lines(plan: Plan) -> list[str]:
    """One line per value the plan chose by trying candidates: what it took, and what ruled out the others."""
    lines = []
    for c in (c for c in plan.choices if len(c.tried) > 1):
        if c.key == "layout":  # the layouts table ranks every one, with why a layout does not build
            lora_only = [v for v, r in c.tried if r == LORA_ONLY]
            if lora_only:
                lines.append(f"chosen: layout {c.chosen}, predicted fastest at this TP size of the layouts that train "
                             f"the whole model ({', '.join(lora_only)} {LORA_ONLY}; ranked below)")
                continue
            lines.append(f"chosen: layout {c.chosen}, predicted fastest of the {len(c.tried)} at this TP size "
                         "(ranked below)")
            continue
        out = "; ".join(f"{c.key}={v} ruled out: {escape(r)}" for v, r in c.tried if r)
        lines.append(f"chosen: {c.key}={c.chosen} of {[v for v, _ in c.tried]}" + (f" ({out})" if out else ""))
    return lines


def print_plan(plan: Plan, console: Console | None = None) -> None:
    cfg = plan.config
    console = console or Console(soft_wrap=True)
    mode = ("separate" if not plan.colocated else
            "colocated (engines stay awake and generate ahead while learners train)" if plan.engines_awake else
            "colocated (engines sleep while learners train)")
    console.print(
        f"[bold]rlgen plan[/]  hardware={plan.hardware} ({plan.nodes} node(s) x {plan.gpus_per_node} GPU)  "
        f"engine={plan.engine_kind}  model={plan.model.name} ({plan.model.params / 1e6:.1f}M params)  "
        f"task={cfg.task.kind.value}",
        highlight=False,
    )
    t = Table(title="placement", title_justify="left")
    for col in ("actor", "kind", "node", "GPUs", "TP"):
        t.add_column(col)
    for e in plan.engines:
        t.add_row(f"engine{e.index}", plan.engine_kind, str(e.node), _gpus(plan, e.gpus), str(e.tensor_parallel_size))
    for lr in plan.learners:
        t.add_row(f"learner{lr.rank}", plan.learner_kind.value, str(lr.node), _gpus(plan, lr.gpu), "-")
    console.print(t)
    engine_gpus = len({(e.node, g) for e in plan.engines for g in e.gpus})
    learner_gpus = sum(1 for lr in plan.learners if lr.gpu is not None)
    console.print(
        f"{len(plan.engines)} {plan.engine_kind} engine(s) of TP {plan.engines[0].tensor_parallel_size if plan.engines else 0} "
        f"on {engine_gpus} GPU(s); {len(plan.learners)} learner rank(s) on {learner_gpus} GPU(s); {mode}",
        highlight=False,
    )
    b = plan.batch
    g = Table(title="step", title_justify="left", show_header=False)
    g.add_column("what")
    g.add_column("value")
    g.add_row("batch", f"{b.prompts_per_step} prompts x {b.samples_per_prompt} samples = {b.sequences_per_step} sequences")
    tokens = cfg.algo.micro_batch_tokens
    mesh = plan.mesh
    if plan.learners:
        g.add_row("learner mesh", mesh.describe() + (
            f": groups of {mesh.sequence} ranks train the same rows, each forwarding 1/{mesh.sequence} of every "
            "micro-batch's tokens (Ulysses sequence parallelism)" if mesh.sequence > 1 else ": data parallel"))
    share = "per sequence group" if mesh.sequence > 1 else "per learner rank"
    g.add_row(share, f"about {b.sequences_per_rank} sequences of equal work, packed (no padding) in "
              + (f"micro-batches of up to {tokens} tokens" if tokens else "one micro-batch")
              + f"; attention: {cfg.learner.attention}")
    shaped = cfg.task.response_length_mean
    g.add_row("sequence", f"<= {b.max_prompt_tokens} prompt + {b.max_new_tokens} new tokens"
              + (f" (RL-shaped: about {shaped_mean(shaped, b.max_new_tokens):.0f} on average, "
                 "task.response_length_mean)" if shaped > 0 else ""))
    g.add_row("async_steps", f"{plan.async_steps} ({'on-policy' if plan.async_steps == 0 else 'engines may run ahead'})")
    g.add_row("partial rollouts", partial_line(cfg.algo, plan.async_steps))
    g.add_row("weight sync", plan.transport.value)
    g.add_row("precision", precision_line(plan))
    g.add_row("deterministic", determinism_line(cfg, plan.engine))
    console.print(g)
    al = Table(title=f"algorithm: {cfg.algo.kind}", title_justify="left", show_header=False)
    al.add_column("what")
    al.add_column("value")
    for what, value in algorithm_rows(cfg.algo) + teacher_rows(plan):
        al.add_row(what, value)
    console.print(al)
    s = Table(title="settings", title_justify="left")
    for col in ("key", "value", "from"):
        s.add_column(col)
    for setting in plan.settings:
        s.add_row(setting.key, str(setting.value), "the config" if setting.source == "config" else setting.source)
    console.print(s)
    for line in choice_lines(plan):
        console.print(line, highlight=False)
    line = memory_line(plan)
    if line:
        console.print(line, highlight=False)
    console.print(checkpoint_line(plan), highlight=False)
    for w in plan.warnings:
        console.print(f"[yellow]note:[/] {escape(w)}", highlight=False)


REFUSED_SHOWN = 3  # layouts that do not build, listed with why; the rest are counted


def print_layouts(options: list[LayoutOption], console: Console | None = None) -> None:
    """The layouts of the plan's hardware, fastest predicted step first (the plan's own marked), then the ones
    that do not build, with why."""
    if not options:
        return
    console = console or Console(soft_wrap=True)
    t = Table(title="layouts of this hardware by predicted step (* the plan's)", title_justify="left")
    for col in ("#", "layout", "engines", "step s", "generate s", "train s"):
        t.add_column(col)
    built = [o for o in options if o.step_s is not None]
    for i, o in enumerate(built, 1):
        t.add_row(str(i), o.label + (" *" if o.current else ""), str(o.engines), f"{o.step_s:.2f}", f"{o.gen_s:.2f}",
                  f"{o.train_s:.2f}")
    console.print(t)
    refused = [o for o in options if o.step_s is None]
    for o in refused[:REFUSED_SHOWN]:
        console.print(f"  not {o.label}: {escape(o.why)}", highlight=False)
    if len(refused) > REFUSED_SHOWN:
        console.print(f"  and {len(refused) - REFUSED_SHOWN} more layouts that do not build (--json lists each, with "
                      "why)", highlight=False)
    line = faster_layout_line(options)
    if line:
        console.print(f"[yellow]layout:[/] {escape(line)}", highlight=False)


def print_plan_and_prediction(plan: Plan, console: Console | None = None) -> None:
    console = console or Console(soft_wrap=True)
    print_plan(plan, console)
    print_prediction(predict(plan), console)
