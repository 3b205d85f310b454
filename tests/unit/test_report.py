"""Report PNGs, the terminal summary and the sweep summary, on synthetic runs."""

from __future__ import annotations

import io
import json
from types import SimpleNamespace

import pytest
from omegaconf import OmegaConf
from rich.console import Console

from rlgen.commands.sweep import SweepSummary, write_sweep_summary
from rlgen.metrics.balance import BalanceContext
from rlgen.metrics.report import balance_summary, plot_timeline, print_summary, report_run_dir, write_report
from rlgen.types import Phase, StepTimeline

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def make_records(steps: int, gen: float, train: float, engines: int = 2, tokens: int = 800) -> list[dict]:
    """On-policy steps: engines load weights and generate while the learner waits, then it trains."""
    out, t = [], 100.0
    for step in range(steps):
        tl = StepTimeline(step)
        end_gen = t + 0.01 + gen
        tl.add("learner0", Phase.wait, t, end_gen)
        for e in range(engines):
            tl.add(f"engine{e}", Phase.sync, t, t + 0.01)
            tl.add(f"engine{e}", Phase.generate, t + 0.01, end_gen - 0.02 * e)
        tl.add("driver", Phase.reward, end_gen, end_gen + 0.01)
        tl.add("learner0", Phase.train, end_gen + 0.01, end_gen + 0.01 + train)
        tl.add("learner0", Phase.sync, end_gen + 0.01 + train, end_gen + 0.02 + train)
        step_s = 0.03 + gen + train
        out.append({"step": step, "timeline": tl.to_dict()["spans"], "response_tokens": tokens, "step_s": step_s,
                    "reward_mean": 0.1 + 0.02 * step, "reward_std": 0.05, "tokens_per_s": tokens / gen})
        t += step_s + 0.002
    return out


def _is_png(path) -> bool:
    return path.is_file() and path.stat().st_size > 5_000 and path.read_bytes()[:8] == PNG_MAGIC


def test_write_report_writes_three_pngs(tmp_path):
    paths = write_report(tmp_path, make_records(12, gen=0.4, train=0.1), BalanceContext(num_engines=2), last_n=5)
    assert set(paths) == {"timeline", "throughput", "reward"}
    for p in paths.values():
        assert _is_png(p), p


def test_timeline_accepts_a_single_step_and_rejects_none(tmp_path):
    assert _is_png(plot_timeline(make_records(1, gen=0.1, train=0.3, engines=1), tmp_path / "t.png"))
    with pytest.raises(ValueError, match="no records"):
        plot_timeline([{"step": 0}], tmp_path / "none.png")


def test_records_without_timelines_still_get_a_reward_plot(tmp_path):
    paths = write_report(tmp_path, [{"step": i, "reward_mean": 0.1 * i, "reward_std": "nan"} for i in range(3)])
    assert list(paths) == ["reward"]
    assert _is_png(paths["reward"])


def test_terminal_summary_and_flat_numbers():
    recs = make_records(6, gen=0.1, train=0.6)
    buf = io.StringIO()
    print_summary(recs, BalanceContext(num_engines=2, async_steps=0), Console(file=buf, width=200))
    text = buf.getvalue()
    assert "training-bound" in text and "engines sat idle" in text
    flat = balance_summary(recs)
    assert flat["kind"] == "training_bound"
    assert flat["tokens_per_s_end_to_end"] == pytest.approx(800 / recs[1]["step_s"])


def _fake_job(job_dir, overrides: list[str], records: list[dict], engines: int, finished: bool = True):
    (job_dir / ".hydra").mkdir(parents=True)
    (job_dir / ".hydra" / "overrides.yaml").write_text("".join(f"- {o}\n" for o in overrides))
    (job_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    plan = {"engines": [{"tensor_parallel_size": 1}] * engines, "async_steps": 0, "colocated": False, "device": "cpu"}
    (job_dir / "plan.json").write_text(json.dumps(plan))
    if finished:
        (job_dir / "summary.json").write_text(json.dumps({"reward_last_20pct": 0.3, "tokens_per_s": 1.0}))


def test_sweep_summary_ranks_runs_by_throughput(tmp_path):
    _fake_job(tmp_path / "0", ["engine.num_engines=1", "steps=6"], make_records(6, gen=0.8, train=0.1, engines=1), 1)
    _fake_job(tmp_path / "1", ["engine.num_engines=2", "steps=6"], make_records(6, gen=0.4, train=0.1), 2)
    _fake_job(tmp_path / "2", ["engine.num_engines=4", "steps=6"], make_records(2, gen=0.2, train=0.1), 4, False)
    md, js = write_sweep_summary(tmp_path)
    runs = json.loads(js.read_text())["runs"]
    assert [r["overrides"][0] for r in runs] == ["engine.num_engines=4", "engine.num_engines=2", "engine.num_engines=1"]
    assert [r["rank"] for r in runs] == [1, 2, 3]
    assert runs[0]["status"] == "stopped" and runs[1]["status"] == "ok"
    assert runs[1]["tokens_per_s_end_to_end"] > runs[2]["tokens_per_s_end_to_end"]
    assert all(r["kind"] == "generation_bound" for r in runs)
    text = md.read_text()
    assert "Every run: `steps=6`" in text
    assert "| 2 | engine.num_engines=2 |" in text
    assert "add 6 engines (engine.num_engines=7)" in text  # one engine at ratio 0.81 / 0.12 = 6.75
    assert "| rank | overrides | layout |" in text and all("layout" in r for r in runs)


def test_the_sweep_says_which_layout_each_point_ran():
    from rlgen.commands.sweep import layout_label
    from rlgen.metrics.balance import BalanceContext

    assert layout_label(BalanceContext(device="cuda", colocated=True, tensor_parallel_size=2)) == "hybrid, TP 2"
    assert layout_label(BalanceContext(device="cuda", engine_gpus=2, learner_gpus=2)) == "split 2+2, TP 1"
    assert layout_label(BalanceContext(device="cpu")) == "CPU"
    assert layout_label(BalanceContext()) == "-"


def test_callback_uses_the_job_dirs_it_saw(tmp_path):
    sweep = tmp_path / "sweep"
    for i, gen in enumerate((0.3, 0.6)):
        _fake_job(sweep / str(i), [f"algo.max_new_tokens={i}"], make_records(4, gen=gen, train=0.1), 2)
    cb = SweepSummary(print_table=False)
    for i in range(2):
        ret = SimpleNamespace(hydra_cfg=OmegaConf.create({"hydra": {"runtime": {"output_dir": str(sweep / str(i))}}}))
        cb.on_job_end(config=None, job_return=ret)
    cb.on_multirun_end(config=OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path / "elsewhere")}}}))
    runs = json.loads((sweep / "sweep_summary.json").read_text())["runs"]
    assert [r["overrides"] for r in runs] == [["algo.max_new_tokens=0"], ["algo.max_new_tokens=1"]]
    assert (sweep / "sweep_summary.md").is_file()


def test_report_run_dir(tmp_path):
    _fake_job(tmp_path, [], make_records(5, gen=0.2, train=0.2), 2)
    buf = io.StringIO()
    paths = report_run_dir(tmp_path, console=Console(file=buf, width=200))
    assert all(_is_png(p) for p in paths.values())
    assert "balance over 4 step(s)" in buf.getvalue()
