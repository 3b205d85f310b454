"""rlgen beside TRL's GRPOTrainer on one GPU: the same model folder, prompts, batch, prompt and response
lengths, reward and learning rate, one side after the other in one invocation, each in its own process.

    python benchmarks/peer_trl.py OUT                                  # 0.5B shape, 32k vocab, 8 x 8, 64 + 256
    python benchmarks/peer_trl.py OUT --preset qwen2_5_1_5b --prompts 64 --new-tokens 1024 --micro 8
    python benchmarks/peer_trl.py OUT --sides rlgen,rlgen_async,trl --steps 12 --warmup 2
    python benchmarks/peer_trl.py OUT --sides rlgen_async,trl --new-tokens 2048 --mean-tokens 256   # RL-shaped
    python benchmarks/peer_trl.py OUT --device cpu --preset tiny --vocab 2000 --new-tokens 8   # a CPU dry run
    python benchmarks/peer_trl.py --report OUT                         # the tables again from OUT's JSON files
    python benchmarks/peer_trl.py OUT --learn                          # reward against time: 64 x 8, 150 steps
    python benchmarks/peer_trl.py OUT --learn --sides trl --timeout 240   # one side per invocation; the two
    python benchmarks/peer_trl.py OUT --learn --sides rlgen --timeout 240 # meet in OUT/learning.json
    python benchmarks/peer_trl.py OUT --learn --device cpu --steps 6   # a CPU dry run (rlgen only without TRL)

Sides:
- ``trl``: TRL's GRPOTrainer with vLLM colocated in its process (``vllm_mode="colocate"``), TRL's defaults
  otherwise (fp32 master weights under bf16 autocast, importance-sampling correction on). On CPU: no vLLM.
- ``rlgen``: ``rlgen train engine=vllm hardware=1xh100`` colocated with one engine (``engine.engines_per_gpu=1``;
  the plan's default at these sizes is two), on-policy: the engine sleeps while the learner trains
  (``algo.async_steps=0``).
- ``rlgen_async``: the same with ``algo.async_steps=1``: the engine stays awake and generates the next batch
  while the learner trains; weight updates land in flight.
- ``rlgen_async_x2``: the same with two engines on the GPU (``engine.engines_per_gpu=2``), splitting the
  engine share and the prompts between them.
- ``rlgen:<name>:<override>``: another rlgen variant with one more override (e.g. ``rlgen:level2:sync.sleep_level=2``).

Every side runs ``--steps`` optimizer steps of ``--prompts`` x ``--samples`` sequences. A step's time is the
wall time between the ends of two consecutive steps, so each side's logging and bookkeeping count. The report
(OUT/peer.json and a table on stdout; sides already in OUT/peer.json for the same inputs stay, so one
comparison can span consecutive invocations) sums up each side's steady steps, those after ``--warmup`` steps
(the last step left out: with async_steps=1 nothing is generated beside it), with rlgen.metrics.steady: the mean
step (``mean_step_s``), the shortest and longest (``step_min_s``, ``step_max_s``), their ratio (``step_spread``:
about 1 for even steps, 2 and more where a short and a long step alternate), the steps' coefficient of variation
(``step_cv``) and the real response tokens a second over them (``tokens_per_s``; TRL's from the mean length it
logs each step); the median step (``median_step_s``) is kept beside them only, since where steps alternate it
lands on either. Also each side's time from process launch to the end of its first step, whether its losses
stayed finite, its mean response length, and the ratio of every side's mean step to TRL's (to the first side's
when TRL is not run). rlgen's phases (generate, train, sync, ...) are means over the records of the same steady
steps (``mean_<key>``). ``--report OUT`` computes these again from each side's ``step_s`` (and ``step_tokens``,
the tokens of each step, where recorded), so a peer.json written before them can be tabled as well.

The model folder is built here (``--model`` takes an existing one): a byte-level BPE tokenizer of ``--vocab``
tokens and a randomly initialised model of the preset's shape, so responses run to the length limit on both
sides; with ``--mean-tokens M`` both sides stop at the same vocab / M stop ids (rlgen.tasks.prompts.length_stop_ids,
rlgen's ``task.response_length_mean``), so lengths are RL-shaped: geometric with mean about M, cut at
``--new-tokens``. The learner micro-batch is ``--micro`` rows on TRL's side; rlgen's learner packs real tokens into
micro-batches of its plan's budget (``--micro-tokens`` sets one). Prompts are raw text (no chat template) of
exactly ``--prompt-tokens`` tokens under that tokenizer.
TRL is not one of rlgen's dependencies: ``pip install 'rlgen[peer]'`` (trl 1.16 with vLLM 0.22-0.31).

Learning mode (``--learn``) compares how fast each side learns rather than how long a step takes. Both sides
train rlgen's ``model=small`` (a ~2.4M-parameter Qwen2 with the character tokenizer, warm-started on the
arith task and cached; built on the GPU when there is one) from the same folder, on the arith task's prompts
as raw text, step s taking ``task.prompts(s, --prompts)`` on both sides (TRL reads them in order from JSONL
rows that carry the answer, and scores the task's reward, exact match, on them as rlgen does). The batch
(``--prompts`` x ``--samples``, default 64 x 8, one micro-batch), the response length (the plan's, 4 tokens),
the learning rate (the plan's, 1e-4), temperature 1.0 and the number of optimizer steps (default 150) are the
same. Sides: ``trl`` (as above, vLLM colocated) and ``rlgen``, ``rlgen train engine=vllm hardware=1xh100
model=small`` as its plan sets it up (colocated, async_steps=1); ``rlgen:<name>:<override>`` adds variants.
Without TRL installed, the rlgen side runs alone (one line says so). Each side's reward is recorded per step
against seconds from its process launch (rlgen: its metrics.jsonl, each step's t_end; TRL: the reward it logs
every step, timed at the step's end), and OUT/learning.json holds per side the points {step, seconds, reward}
and the first step whose loss, reward or grad norm was NaN or infinite (null when none), and a summary: each
side's launch to first step, its reward smoothed over ``--window`` steps (the last window's mean, and the best),
the target reward (``--target``, else the best smoothed reward every side reaches), the first second and step
each side's smoothed reward reaches it (also counted from the end of its first step), and the ratio of rlgen's
seconds to TRL's (the goal: 0.5 or less). A table goes to stdout and the smoothed curves to OUT/learning.png.
As with peer.json, sides run before into OUT on the same inputs stay.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import math
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import time
from pathlib import Path

from rlgen.metrics.steady import Steady, steady

HERE = Path(__file__).resolve()
BUILTIN_SIDES = {
    "rlgen": ["algo.async_steps=0", "engine.engines_per_gpu=1"],
    "rlgen_async": ["algo.async_steps=1", "engine.engines_per_gpu=1"],
    "rlgen_async_x2": ["algo.async_steps=1", "engine.engines_per_gpu=2"],
    "rlgen_partial": ["algo.async_steps=1", "engine.engines_per_gpu=1", "algo.partial_rollouts=0.5",
                      "algo.partial_max_steps=2"],
}


# -- inputs ----------------------------------------------------------------------------------------------
def random_texts(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = ["".join(rng.choice(letters) for _ in range(rng.randint(2, 9))) for _ in range(60000)]
    return [" ".join(rng.choice(words) for _ in range(50)) for _ in range(n)]


def build_model(out: Path, preset: str, vocab: int, device: str) -> Path:
    """A model folder of the preset's shape with a `vocab`-token BPE tokenizer trained on random words."""
    from rlgen.config.compose import compose_run_config
    from rlgen.models.local import build_folder

    if (out / "config.json").is_file():
        return out
    shape = compose_run_config([f"model={preset}"]).model
    return build_folder(out, shape, random_texts(8000, seed=1), vocab_size=vocab, device=device)


def exact_prompts(model_dir: Path, n: int, tokens: int, seed: int = 0) -> list[str]:
    """n texts of exactly `tokens` tokens each (encoded without special tokens) under the folder's tokenizer."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model_dir)
    out: list[str] = []
    for text in random_texts(50 * n + 100, seed):
        ids = tok.encode(text, add_special_tokens=False)
        if len(ids) < tokens:
            continue
        cut = tok.decode(ids[:tokens]).strip()
        if len(tok.encode(cut, add_special_tokens=False)) == tokens:
            out.append(cut)
            if len(out) == n:
                return out
    raise SystemExit(f"could not make {n} prompts of exactly {tokens} tokens; try another --prompt-tokens")


def shaped_stop_ids(model_dir: Path, mean: int) -> list[int]:
    """The stop ids that give RL-shaped lengths of this mean on both sides ([] for 0), drawn as rlgen draws
    task.response_length_mean's, away from the tokenizer's special ids."""
    if mean <= 0:
        return []
    from transformers import AutoTokenizer

    from rlgen.tasks.prompts import length_stop_ids

    tok = AutoTokenizer.from_pretrained(model_dir)
    vocab = json.loads((model_dir / "config.json").read_text())["vocab_size"]
    return length_stop_ids(vocab, mean, seed=0, keep=tok.all_special_ids)


def write_data(path: Path, prompts: list[str]) -> Path:
    """JSONL rows for both sides; the answer is a fixed string that char_match scores against."""
    path.write_text("".join(json.dumps({"prompt": p, "answer": "the answer is forty two"}) + "\n" for p in prompts))
    return path


# -- the TRL side (runs in a process of its own) -------------------------------------------------------------
def trl_worker(spec: dict) -> None:
    import pyarrow as pa
    import torch
    from datasets import Dataset
    from datasets.table import InMemoryTable
    from transformers import AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from rlgen.tasks.rewards import clamp_reward, resolve_reward

    score = resolve_reward(spec.get("reward", "char_match"))
    cuda = spec["device"] == "cuda"
    rows = [json.loads(line) for line in Path(spec["data"]).read_text().splitlines()]
    # A fingerprint of our own: datasets otherwise hashes the table with dill, which failed on one GPU host
    # (PicklingError on pyarrow's MonthDayNano class) before training began.
    data = Dataset(InMemoryTable(pa.Table.from_pylist(rows)), fingerprint="peer-trl-prompts")
    seqs = spec["prompts"] * spec["samples"]
    ends: list[float] = []
    logged: list[dict] = []

    def dump() -> None:
        """The result so far, replaced whole, so a side stopped on its timeout still leaves its steps."""
        losses = [r["loss"] for r in logged if "loss" in r]
        lengths = [r["completions/mean_length"] for r in logged if "completions/mean_length" in r]
        tmp = Path(spec["result"] + ".tmp")
        tmp.write_text(json.dumps({"step_ends": ends, "losses": losses, "mean_length": lengths, "logs": logged}))
        tmp.replace(spec["result"])

    class Times(TrainerCallback):
        def on_step_end(self, args, state, control, **kw):
            if cuda:
                torch.cuda.synchronize()
            ends.append(time.time())

        def on_log(self, args, state, control, logs=None, **kw):
            numbers = {k: v for k, v in (logs or {}).items() if isinstance(v, (int, float))}
            logged.append({**numbers, "step": state.global_step})
            dump()

    def reward(completions, answer, **_):
        return [clamp_reward(score(c, a)) for c, a in zip(completions, answer)]

    args = GRPOConfig(
        output_dir=spec["work"],
        per_device_train_batch_size=spec["micro"],
        gradient_accumulation_steps=seqs // spec["micro"],
        num_generations=spec["samples"],
        max_completion_length=spec["new_tokens"],
        learning_rate=spec["lr"],
        lr_scheduler_type="constant",
        warmup_steps=0,
        gradient_checkpointing=spec["gradient_checkpointing"],
        bf16=cuda,
        use_cpu=not cuda,
        use_vllm=cuda,
        vllm_mode="colocate",
        vllm_gpu_memory_utilization=spec["engine_share"],
        vllm_max_model_length=spec["prompt_tokens"] + spec["new_tokens"] + 16,
        temperature=1.0,
        beta=0.0,
        max_steps=spec["steps"],
        logging_steps=1,
        logging_nan_inf_filter=False,  # a NaN or infinite loss is logged as it is, not replaced by the mean
        save_strategy="no",
        report_to="none",
        shuffle_dataset=False,
        seed=0,
        disable_tqdm=True,
        # the RL-shaped stop ids: vLLM's SamplingParams take them as stop_token_ids, transformers' generate as eos
        generation_kwargs=({"stop_token_ids" if cuda else "eos_token_id": spec["stop_ids"]} if spec.get("stop_ids")
                           else None),
    )
    trainer = GRPOTrainer(model=spec["model"], reward_funcs=reward, args=args, train_dataset=data,
                          processing_class=AutoTokenizer.from_pretrained(spec["model"]), callbacks=[Times()])
    trainer.train()
    dump()


# -- running the sides ---------------------------------------------------------------------------------------
def run_side(cmd: list[str], log: Path, timeout_s: float, env: dict | None = None) -> tuple[int, float]:
    """(exit code, launch time); the side runs in its own process group, killed whole on timeout."""
    launched = time.time()
    with open(log, "w") as f:
        proc = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, start_new_session=True,
                                env={**os.environ, **(env or {})})
        try:
            rc = proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
            rc = 124
    if rc != 0:  # a side that failed or overran may leave Ray's daemons (and their GPU memory) behind
        subprocess.run([sys.executable, "-m", "ray.scripts.scripts", "stop", "--force"], capture_output=True,
                       timeout=120, check=False)
    return rc, launched


STEP_FIELDS = ("mean_step_s", "step_spread", "step_min_s", "step_max_s", "step_cv", "tokens_per_s",
               "median_step_s")


def steady_steps(steps: list[float], warmup: int, tokens: list[float] | None = None) -> Steady | None:
    """Steps warmup .. n-2 (steps[k-1] is step k) summed up, with each step's real response tokens where given
    (one count a step, else none are used). The last step is left out too: with async_steps=1 no next batch is
    generated beside it, so it is not the steady state."""
    if tokens is not None and len(tokens) != len(steps):
        tokens = None
    return steady(steps, tokens, warmup=max(warmup - 1, 0), tail=1)


def step_fields(steps: list[float], warmup: int, tokens: list[float] | None = None) -> dict:
    """A side's STEP_FIELDS over its steady steps (each None where no steady step is left)."""
    s = steady_steps(steps, warmup, tokens)
    if s is None:
        return dict.fromkeys(STEP_FIELDS)
    return {"mean_step_s": s.mean_s, "step_spread": s.spread, "step_min_s": s.min_s, "step_max_s": s.max_s,
            "step_cv": s.cv, "tokens_per_s": s.tokens_per_s, "median_step_s": s.median_s}


def summarize(name: str, rc: int, launched: float, ends: list[float], losses: list[float], lengths: list[float],
              warmup: int, extra: dict | None = None, tokens: list[float] | None = None) -> dict:
    """One side's result from the ends of its steps (one a step, from its process launch) and each step's loss
    and mean response length; tokens: each step's real response tokens, one count for each end."""
    steps = [b - a for a, b in zip(ends, ends[1:])]  # step k (k >= 1): end of k-1 to end of k
    per_step = [float(t) for t in tokens[1:]] if tokens is not None and len(tokens) == len(ends) else None
    return {
        "side": name,
        "rc": rc,
        "steps_done": len(ends),
        **step_fields(steps, warmup, per_step),
        "step_s": [round(s, 4) for s in steps],
        **({"step_tokens": per_step} if per_step is not None else {}),
        "first_step_s": ends[0] - launched if ends else None,
        "finite": bool(losses) and all(math.isfinite(x) for x in losses),
        "mean_response_tokens": statistics.fmean(lengths) if lengths else None,
        **(extra or {}),
    }


def trl_side(out: Path, spec: dict, warmup: int, timeout_s: float) -> dict:
    work = out / "trl"
    work.mkdir(parents=True, exist_ok=True)
    spec = {**spec, "work": str(work), "result": str(work / "result.json")}
    (work / "spec.json").write_text(json.dumps(spec))
    rc, launched = run_side([sys.executable, str(HERE), "--trl-worker", str(work / "spec.json")], work / "log.txt",
                            timeout_s, {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"})
    res = json.loads((work / "result.json").read_text()) if (work / "result.json").is_file() else {}
    error = work / "error.txt"
    extra = {"error": error.read_text().strip().splitlines()[-1]} if error.is_file() else {}
    lengths = res.get("mean_length", [])
    tokens = [n * spec["prompts"] * spec["samples"] for n in lengths]  # TRL logs each step's mean length
    return summarize("trl", rc, launched, res.get("step_ends", []), res.get("losses", []), lengths, warmup, extra,
                     tokens)


def engine_args(spec: dict) -> list[str]:
    """The rlgen side's engine and hardware: vLLM colocated on the GPU with the peer's engine share, or hf on CPU."""
    if spec["device"] == "cuda":
        return ["engine=vllm", f"hardware={spec['hardware']}", f"engine.gpu_memory_utilization={spec['engine_share']}",
                f"engine.max_model_len={spec['prompt_tokens'] + spec['new_tokens'] + 16}"]
    return ["engine=hf", "hardware=cpu"]


def summary_of(work: Path, keys: tuple[str, ...]) -> dict:
    """Those keys of the rlgen run's summary.json (none when the run wrote none)."""
    path = work / "run" / "summary.json"
    summary = json.loads(path.read_text()) if path.is_file() else {}
    return {k: summary[k] for k in keys if k in summary}


def rlgen_side(out: Path, name: str, overrides: list[str], spec: dict, warmup: int, timeout_s: float) -> dict:
    work = out / name
    work.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "rlgen.cli", "train", f"hydra.run.dir={work / 'run'}", "progress=false",
           f"model.path={spec['model']}", "task=jsonl", f"task.path={spec['data']}", "task.prompt_format=raw",
           f"task.max_prompt_tokens={spec['prompt_tokens']}", "task.reward=char_match",
           f"algo.prompts_per_step={spec['prompts']}", f"algo.samples_per_prompt={spec['samples']}",
           f"algo.max_new_tokens={spec['new_tokens']}", f"algo.lr={spec['lr']}",
           f"learner.gradient_checkpointing={str(spec['gradient_checkpointing']).lower()}", f"steps={spec['steps']}",
           "checkpoint.every=0", "checkpoint.keep=1"]
    if spec.get("micro_tokens"):
        cmd.append(f"algo.micro_batch_tokens={spec['micro_tokens']}")
    if spec.get("stop_ids"):
        cmd.append(f"task.stop_token_ids=[{','.join(map(str, spec['stop_ids']))}]")
    cmd += engine_args(spec) + overrides
    rc, launched = run_side(cmd, work / "log.txt", timeout_s)
    metrics = work / "run" / "metrics.jsonl"
    recs = [json.loads(line) for line in metrics.read_text().splitlines()] if metrics.is_file() else []
    extra = {**summary_of(work, ("first_rollout_s", "setup_s", "sync_warmup_s")), **phase_means(recs, warmup),
             "overrides": overrides}
    return summarize(name, rc, launched, [r["t_end"] for r in recs], [r["loss"] for r in recs],
                     [r["response_tokens"] / r["sequences"] for r in recs], warmup, extra,
                     [r["response_tokens"] for r in recs])


PHASES = ("generate_s", "train_s", "sync_s", "sync_pause_s", "overlap_efficiency", "sync_start_s", "sync_load_s",
          "sync_pack_s", "sync_finish_s", "packed_tokens", "micro_batches", "gen/tail_s", "gen/tail_filled",
          "learner_peak_gib")


def phase_means(recs: list[dict], warmup: int) -> dict:
    """mean_<key> of each of PHASES over the records of the steady steps (record k is step k; steps warmup ..
    n-2, as steady_steps counts them), for the keys those records hold."""
    kept = recs[max(warmup, 1):-1]
    out = {}
    for key in PHASES:
        vals = [r[key] for r in kept if key in r]
        if vals:
            out[f"mean_{key}"] = statistics.fmean(vals)
    return out


def parse_side(text: str, builtin: dict[str, list[str]] = BUILTIN_SIDES) -> tuple[str, list[str]]:
    if text == "trl" or text in builtin:
        return text, builtin.get(text, [])
    kind, _, rest = text.partition(":")
    name, _, overrides = rest.partition(":")
    if kind != "rlgen" or not name:
        raise SystemExit(f"--sides: {text!r} is not trl, {', '.join(builtin)} or rlgen:<name>:<overrides>")
    return name, [o for o in overrides.split(",") if o]


# -- the learning comparison (--learn) -----------------------------------------------------------------------
LEARN_SIDES = {"rlgen": []}  # rlgen as its plan sets it up: colocated, async_steps=1 on one GPU
CHECKED = ("loss", "reward", "grad_norm")  # a step where one of these is NaN or infinite is reported


def is_finite(x: object) -> bool:
    return isinstance(x, (int, float)) and math.isfinite(x)


def smooth(values: list[float], window: int) -> list[float | None]:
    """Trailing means over `window` values (over all of them when there are fewer); None until a full window."""
    w = max(1, min(window, len(values)))
    return [statistics.fmean(values[i + 1 - w : i + 1]) if i + 1 >= w else None for i in range(len(values))]


def smoothed(points: list[dict], window: int) -> list[dict]:
    """The points from the first full window on, each reward replaced by its window's mean. Points whose reward
    is not finite are left out first."""
    kept = [p for p in points if is_finite(p["reward"])]
    means = smooth([p["reward"] for p in kept], window)
    return [{**p, "reward": m} for p, m in zip(kept, means) if m is not None]


def first_at(curve: list[dict], target: float) -> dict | None:
    """The first point of a smoothed curve whose reward reaches target (a hair under counts: the default target
    is one of the curves' own maxima)."""
    return next((p for p in curve if p["reward"] >= target - 1e-12), None)


def first_nonfinite(rows: list[dict], keys: tuple[str, ...] = CHECKED) -> dict | None:
    """{step, key, value} of the first row where one of `keys` is NaN or infinite; absent keys are skipped."""
    for row in rows:
        for key in keys:
            v = row.get(key)
            if isinstance(v, (int, float)) and not math.isfinite(v):
                return {"step": row["step"], "key": key, "value": str(v)}
    return None


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def learning_summary(sides: dict[str, dict], window: int, target: float | None = None, base: str = "trl") -> dict:
    """Per side: its smoothed reward at the end (the mean of its last `window` steps) and at best, and when it
    first reaches the target, in seconds from launch and from the end of its first step, with its ratio to
    `base`'s time (rlgen / TRL). The target is `target`, else the best smoothed reward that every side reaches."""
    curves = {name: smoothed(side["points"], window) for name, side in sides.items()}
    best = {name: max((p["reward"] for p in c), default=None) for name, c in curves.items()}
    every = min(best.values()) if best and all(b is not None for b in best.values()) else None
    goal = target if target is not None else every
    out: dict[str, dict] = {}
    for name, curve in curves.items():
        points = sides[name]["points"]
        first = points[0]["seconds"] if points else None
        hit = first_at(curve, goal) if goal is not None else None
        out[name] = {
            "steps": len(points),
            "launch_to_first_step_s": first,
            "final_reward": curve[-1]["reward"] if curve else None,
            "best_reward": best[name],
            "target_step": hit["step"] if hit else None,
            "target_s": hit["seconds"] if hit else None,
            "target_s_after_first_step": hit["seconds"] - first if hit else None,
            "nonfinite": sides[name].get("nonfinite"),
        }
    if base in out:
        for name, side in out.items():
            if name != base:
                side["ratio"] = ratio(side["target_s"], out[base]["target_s"])
                side["ratio_after_first_step"] = ratio(side["target_s_after_first_step"],
                                                       out[base]["target_s_after_first_step"])
    return {"window": window, "target": goal, "target_given": target is not None, "every_side_reaches": every,
            "base": base, "sides": out, "ratio": out.get("rlgen", {}).get("ratio")}


def read_rlgen_metrics(path: Path, launched: float) -> tuple[list[dict], list[dict]]:
    """(points, checks) from a run's metrics.jsonl. points: {step, seconds, reward}, step counting optimizer
    steps done (from 1), seconds from `launched` to the step's end (its t_end, else its last timeline span's
    end); checks: each step's loss, reward and grad norm, for first_nonfinite."""
    points, checks = [], []
    lines = path.read_text().splitlines() if path.is_file() else []
    for rec in (json.loads(line) for line in lines if line.strip()):
        end = rec["t_end"] if "t_end" in rec else max(span["end"] for span in rec["timeline"])
        step = rec["step"] + 1
        points.append({"step": step, "seconds": end - launched, "reward": rec["reward_mean"]})
        checks.append({"step": step, "loss": rec.get("loss"), "reward": rec["reward_mean"],
                       "grad_norm": rec.get("grad_norm")})
    return points, checks


def read_trl_result(res: dict, launched: float) -> tuple[list[dict], list[dict]]:
    """(points, checks) from the TRL worker's result: one logged reward per step (logging_steps=1), timed at
    the end of its step."""
    ends = res.get("step_ends", [])
    logs = [r for r in res.get("logs", []) if "reward" in r and 1 <= r.get("step", 0) <= len(ends)]
    points = [{"step": r["step"], "seconds": ends[r["step"] - 1] - launched, "reward": r["reward"]} for r in logs]
    checks = [{"step": r["step"], **{k: r[k] for k in CHECKED if k in r}} for r in res.get("logs", []) if "step" in r]
    return points, checks


def learn_inputs(out: Path, args: argparse.Namespace) -> dict:
    """The spec both sides share: rlgen's model=small folder (warm-started on arith, cached), the arith prompts
    of every step as JSONL rows with their answers, and the plan's learning rate and response length."""
    from rlgen.config.compose import compose_run_config
    from rlgen.models import prepare_model
    from rlgen.plan import build_plan
    from rlgen.tasks import build_task

    gpu = args.device == "cuda"
    cfg = compose_run_config(["model=small", "task=arith"]
                             + (["engine=vllm", f"hardware={args.hardware}"] if gpu else []))
    plan = build_plan(cfg).config
    model = Path(args.model).resolve() if args.model else Path(prepare_model(cfg, device=args.device))
    task = build_task(cfg.task)
    rows = [{"prompt": p.text, "answer": p.answer} for step in range(args.steps + 2)
            for p in task.prompts(step, args.prompts)]
    data = out / "learn" / "prompts.jsonl"
    data.parent.mkdir(parents=True, exist_ok=True)
    data.write_text("".join(json.dumps(r) + "\n" for r in rows))
    new_tokens = args.new_tokens or plan.algo.max_new_tokens
    return {"mode": "learn", "model": str(model), "data": str(data), "device": args.device, "task": "arith",
            "reward": cfg.task.reward, "prompts": args.prompts, "samples": args.samples,
            "prompt_tokens": cfg.task.max_prompt_tokens, "new_tokens": new_tokens,
            "micro": args.micro or args.prompts * args.samples, "lr": args.lr or plan.algo.lr, "temperature": 1.0,
            "gradient_checkpointing": False, "engine_share": args.engine_share,
            "hardware": args.hardware if gpu else "cpu", "steps": args.steps}


def fresh(work: Path) -> Path:
    """The side's folder, emptied: nothing of an earlier run may be read as this one's."""
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    return work


def learn_trl_side(out: Path, spec: dict, timeout_s: float) -> dict:
    work = fresh(out / "learn" / "trl")
    spec = {**spec, "work": str(work), "result": str(work / "result.json")}
    (work / "spec.json").write_text(json.dumps(spec))
    rc, launched = run_side([sys.executable, str(HERE), "--trl-worker", str(work / "spec.json")], work / "log.txt",
                            timeout_s, {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"})
    res = json.loads((work / "result.json").read_text()) if (work / "result.json").is_file() else {}
    points, checks = read_trl_result(res, launched)
    error = work / "error.txt"
    extra = {"error": error.read_text().strip().splitlines()[-1]} if error.is_file() else {}
    return {"rc": rc, "points": points, "nonfinite": first_nonfinite(checks), **extra}


def learn_rlgen_side(out: Path, name: str, overrides: list[str], spec: dict, timeout_s: float) -> dict:
    work = fresh(out / "learn" / name)
    cmd = [sys.executable, "-m", "rlgen.cli", "train", f"hydra.run.dir={work / 'run'}", "progress=false",
           "model=small", f"model.path={spec['model']}", "task=arith", f"algo.prompts_per_step={spec['prompts']}",
           f"algo.samples_per_prompt={spec['samples']}", f"algo.max_new_tokens={spec['new_tokens']}",
           f"algo.lr={spec['lr']}", f"algo.temperature={spec['temperature']}",
           "algo.micro_batch_tokens=0", "learner.gradient_checkpointing=false", f"steps={spec['steps']}",
           "checkpoint.every=0", "checkpoint.keep=1"]
    cmd += engine_args(spec) + overrides
    rc, launched = run_side(cmd, work / "log.txt", timeout_s)
    points, checks = read_rlgen_metrics(work / "run" / "metrics.jsonl", launched)
    extra = summary_of(work, ("first_rollout_s", "setup_s"))
    return {"rc": rc, "points": points, "nonfinite": first_nonfinite(checks), "overrides": overrides, **extra}


def learn_table(report: dict) -> str:
    s = report["summary"]
    w = s["window"]
    base = s["base"]
    lines = [f"| side | rc | steps | first step s | reward, last {w} | best smoothed | target at step | target s "
             f"| after first step s | vs {base} | non-finite |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---|"]

    def num(v: float | None, fmt: str) -> str:
        return format(v, fmt) if v is not None else "-"

    for name, side in s["sides"].items():
        bad = side["nonfinite"]
        where = f"{bad['key']} at step {bad['step']}" if bad else "no"
        cells = [name, str(report["sides"][name]["rc"]), str(side["steps"]),
                 num(side["launch_to_first_step_s"], ".1f"), num(side["final_reward"], ".3f"),
                 num(side["best_reward"], ".3f"), num(side["target_step"], "d"), num(side["target_s"], ".1f"),
                 num(side["target_s_after_first_step"], ".1f"), num(side.get("ratio"), ".2f"), where]
        lines.append("| " + " | ".join(cells) + " |")
    how = "given" if s["target_given"] else "the best smoothed reward every side reaches"
    lines.append(f"target reward {num(s['target'], '.3f')} ({how}); rlgen / {base} seconds to it: "
                 f"{num(s['ratio'], '.2f')} (goal <= 0.5)")
    return "\n".join(lines)


def plot_learning(report: dict, path: Path) -> Path:
    """Smoothed reward against seconds from launch, one line per side, the raw step rewards faint behind."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    s = report["summary"]
    fig = Figure(figsize=(8, 4.5))
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    for i, (name, side) in enumerate(report["sides"].items()):
        color = f"C{i}"
        raw = [p for p in side["points"] if is_finite(p["reward"])]
        ax.plot([p["seconds"] for p in raw], [p["reward"] for p in raw], ".", color=color, alpha=0.2, markersize=3)
        curve = smoothed(side["points"], s["window"])
        ax.plot([p["seconds"] for p in curve], [p["reward"] for p in curve], "-", color=color, label=name)
    if s["target"] is not None:
        ax.axhline(s["target"], color="gray", linestyle="--", linewidth=0.8, label=f"target {s['target']:.3f}")
    ax.set_xlabel("seconds from process launch")
    ax.set_ylabel(f"reward (mean of last {s['window']} steps)")
    title = f"{report['spec']['prompts']} x {report['spec']['samples']} per step"
    if s["ratio"] is not None:
        title += f"; rlgen / {s['base']} time to target: {s['ratio']:.2f}"
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return path


def jsonable(obj: object) -> object:
    """NaN and infinities as None, so learning.json is strict JSON."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: jsonable(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [jsonable(v) for v in obj]
    return obj


def write_learning(out: Path, report: dict) -> None:
    report["summary"] = learning_summary(report["sides"], report["window"], report.get("target"))
    (out / "learning.json").write_text(json.dumps(jsonable(report), indent=2))
    plot_learning(report, out / "learning.png")
    print(learn_table(report))


def learn(args: argparse.Namespace, out: Path) -> None:
    args.prompts = args.prompts or 64
    args.steps = args.steps or 150
    t0 = time.time()
    spec = learn_inputs(out, args)
    build_s = time.time() - t0
    wanted = [parse_side(t, LEARN_SIDES) for t in (args.sides or "rlgen,trl").split(",")]
    if any(name == "trl" for name, _ in wanted) and importlib.util.find_spec("trl") is None:
        print("TRL is not installed (pip install 'rlgen[peer]'): running the rlgen side only", flush=True)
        wanted = [(name, o) for name, o in wanted if name != "trl"]
    sides: dict[str, dict] = {}
    earlier = out / "learning.json"
    if earlier.is_file():  # sides run before into this OUT on the same inputs
        prev = json.loads(earlier.read_text())
        if prev.get("spec") == spec:
            sides = {k: v for k, v in prev["sides"].items() if k not in {name for name, _ in wanted}}
    for name, overrides in wanted:
        print(f"== {name} {' '.join(overrides)}", flush=True)
        side = (learn_trl_side(out, spec, args.timeout) if name == "trl"
                else learn_rlgen_side(out, name, overrides, spec, args.timeout))
        print(json.dumps({k: v for k, v in side.items() if k != "points"} | {"steps_done": len(side["points"])}),
              flush=True)
        sides[name] = side
    report = {"spec": spec, "model_build_s": build_s, "window": args.window, "target": args.target, "sides": sides,
              "date": time.strftime("%Y-%m-%d"), "versions": versions()}
    write_learning(out, report)


def base_mean(results: list[dict]) -> float | None:
    """The mean step every side's ratio is to: TRL's, else the first side's with one."""
    timed = [r for r in results if r.get("mean_step_s")]
    return next((r for r in timed if r["side"] == "trl"), timed[0] if timed else {}).get("mean_step_s")


def cell(value: float | None, fmt: str, suffix: str = "") -> str:
    """A table cell: the value formatted, "-" for none."""
    return f"{value:{fmt}}{suffix}" if value is not None else "-"


def table(results: list[dict]) -> str:
    """The sides as a markdown table: the mean step, its spread and its ratio to the base's mean step first."""
    base = base_mean(results)
    lines = ["| side | rc | mean step s | spread (max/min) | vs base (means) | tokens/s | median step s "
             "| first step s (from launch) | finite | response tokens |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---|---:|"]
    for r in results:
        mean = r.get("mean_step_s")
        cells = [r["side"], str(r["rc"]), cell(mean, ".3f"), cell(r.get("step_spread"), ".2f"),
                 cell(mean / base if mean and base else None, ".2f", "x"), cell(r.get("tokens_per_s"), ".0f"),
                 cell(r.get("median_step_s"), ".3f"), cell(r.get("first_step_s"), ".1f"), str(r["finite"]),
                 cell(r.get("mean_response_tokens") or None, ".0f")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def retable(report: dict) -> dict:
    """The report with each side's STEP_FIELDS computed again from its step_s (and step_tokens where recorded),
    so peer.json files written before those fields are tabled alike; a side without step_s keeps what it has."""
    for r in report["sides"]:
        if "step_s" in r:
            r.update(step_fields(r["step_s"], report.get("warmup", 2), r.get("step_tokens")))
    return report


def main() -> None:
    if len(sys.argv) == 3 and sys.argv[1] == "--report":  # the tables again from OUT/peer.json, OUT/learning.json
        done = Path(sys.argv[2])
        if (done / "peer.json").is_file() or not (done / "learning.json").is_file():
            report = retable(json.loads((done / "peer.json").read_text()))
            (done / "peer.json").write_text(json.dumps(report, indent=2))
            print(table(report["sides"]))
        if (done / "learning.json").is_file():
            write_learning(done, json.loads((done / "learning.json").read_text()))
        return
    if len(sys.argv) == 3 and sys.argv[1] == "--trl-worker":
        spec = json.loads(Path(sys.argv[2]).read_text())
        try:
            trl_worker(spec)
        except BaseException:
            import traceback

            Path(spec["work"], "error.txt").write_text(traceback.format_exc())
            raise
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out")
    ap.add_argument("--model", help="an existing model folder (default: build one in OUT/model)")
    ap.add_argument("--preset", default="qwen2_5_0_5b")
    ap.add_argument("--vocab", type=int, default=32000)
    ap.add_argument("--prompts", type=int, help="prompts per step (default 8; --learn: 64)")
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--prompt-tokens", type=int, default=64, help="(--learn: the task's, 8)")
    ap.add_argument("--new-tokens", type=int, help="(default 256; --learn: the plan's, 4)")
    ap.add_argument("--micro", type=int, help="TRL's learner micro-batch in rows (default 16; --learn: the whole batch)")
    ap.add_argument("--micro-tokens", type=int, help="rlgen's learner micro-batch in packed tokens (default: the plan's)")
    ap.add_argument("--mean-tokens", type=int, default=0, help="RL-shaped lengths on both sides: stop ids for "
                    "responses of about this many tokens (0: every response runs to --new-tokens)")
    ap.add_argument("--lr", type=float, help="(default 1e-6; --learn: the plan's, 1e-4)")
    ap.add_argument("--no-gradient-checkpointing", action="store_true", help="(--learn: always off)")
    ap.add_argument("--engine-share", type=float, default=0.35, help="vLLM gpu_memory_utilization, both sides")
    ap.add_argument("--hardware", default="1xh100", help="rlgen's hardware preset")
    ap.add_argument("--steps", type=int, help="optimizer steps per side (default 12; --learn: 150)")
    ap.add_argument("--warmup", type=int, default=2, help="steps left out of the steady steps (their mean)")
    ap.add_argument("--sides", help="(default rlgen,rlgen_async,trl; --learn: rlgen,trl)")
    ap.add_argument("--device", choices=["cuda", "cpu"], default=None)
    ap.add_argument("--timeout", type=float, default=900, help="seconds per side")
    ap.add_argument("--learn", action="store_true", help="compare reward against wall-clock time on model=small")
    ap.add_argument("--window", type=int, default=10, help="--learn: steps in each smoothed reward")
    ap.add_argument("--target", type=float, help="--learn: the reward to time (default: the best smoothed reward "
                    "every side reaches)")
    args = ap.parse_args()

    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    if args.device is None:
        import torch

        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.learn:
        learn(args, out)
        return
    for key, value in {"prompts": 8, "new_tokens": 256, "micro": 16, "lr": 1e-6, "steps": 12,
                       "sides": "rlgen,rlgen_async,trl"}.items():
        if getattr(args, key) is None:
            setattr(args, key, value)
    t0 = time.time()
    model = Path(args.model).resolve() if args.model else build_model(out / "model", args.preset, args.vocab,
                                                                       args.device)
    build_s = time.time() - t0
    data = write_data(out / "prompts.jsonl", exact_prompts(model, args.prompts * (args.steps + 2), args.prompt_tokens))
    spec = {"model": str(model), "data": str(data), "device": args.device, "prompts": args.prompts,
            "samples": args.samples, "prompt_tokens": args.prompt_tokens, "new_tokens": args.new_tokens,
            "micro": args.micro, "lr": args.lr, "gradient_checkpointing": not args.no_gradient_checkpointing,
            "engine_share": args.engine_share, "hardware": args.hardware, "steps": args.steps,
            "micro_tokens": args.micro_tokens, "mean_tokens": args.mean_tokens,
            "stop_ids": shaped_stop_ids(model, args.mean_tokens)}
    results = []
    earlier = out / "peer.json"
    if earlier.is_file():  # sides run before into this OUT on the same inputs (the machine allows one call's time)
        prev = json.loads(earlier.read_text())
        if prev["spec"] == spec:
            wanted = {parse_side(t)[0] for t in args.sides.split(",")}
            results = [r for r in prev["sides"] if r["side"] not in wanted]
    for text in args.sides.split(","):
        name, overrides = parse_side(text)
        print(f"== {name} {' '.join(overrides)}", flush=True)
        r = (trl_side(out, spec, args.warmup, args.timeout) if name == "trl"
             else rlgen_side(out, name, overrides, spec, args.warmup, args.timeout))
        print(json.dumps({k: v for k, v in r.items() if k not in ("step_s", "step_tokens")}), flush=True)
        results.append(r)
    report = {"spec": spec, "model_build_s": build_s, "warmup": args.warmup, "sides": results,
              "date": time.strftime("%Y-%m-%d"), "versions": versions()}
    (out / "peer.json").write_text(json.dumps(report, indent=2))
    print(table(results))


def versions() -> dict:
    import importlib.metadata as md

    found = {}
    for pkg in ("rlgen", "trl", "vllm", "torch", "transformers", "deepspeed", "ray", "accelerate"):
        try:
            found[pkg] = md.version(pkg)
        except md.PackageNotFoundError:
            found[pkg] = None
    try:
        import torch

        if torch.cuda.is_available():
            found["gpu"] = torch.cuda.get_device_name(0)
    except ImportError:
        pass
    return found


if __name__ == "__main__":
    main()
