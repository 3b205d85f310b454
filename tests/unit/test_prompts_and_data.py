"""Real workloads on a model folder built here: prompts rendered through its chat template and counted in its
tokens, its end-of-sequence ids, stop strings, data sets read with Hugging Face datasets, and the scorer."""

from __future__ import annotations

import json
import time

import pytest

from rlgen.config import TaskConfig
from rlgen.config.compose import compose_run_config
from rlgen.tasks.base import TaskDataError
from rlgen.tasks.prompts import PromptRenderer, cut_at_stop, model_stop_ids
from rlgen.types import Completion

pytest.importorskip("datasets")


@pytest.fixture(scope="module")
def tok(local_model):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(local_model / "model"))


def test_chat_prompts_go_through_the_template(tok):
    r = PromptRenderer(tok, TaskConfig(prompt_format="auto", system_prompt="Be brief.", max_prompt_tokens=256))
    ids = r.ids("Ava has 3 apples.")
    assert r.format == "chat"
    assert tok.decode(ids) == ("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nAva has 3 apples."
                               "<|im_end|>\n<|im_start|>assistant\n")
    raw = PromptRenderer(tok, TaskConfig(prompt_format="raw", max_prompt_tokens=256))
    assert tok.decode(raw.ids("Ava has 3 apples.")) == "Ava has 3 apples."
    assert len(ids) > len(raw.ids("Ava has 3 apples.")) + 10  # the template's tokens are counted


def test_chat_needs_a_template():
    from rlgen.models import build_tokenizer

    with pytest.raises(TaskDataError, match="has no chat template; use task.prompt_format=raw"):
        PromptRenderer(build_tokenizer(), TaskConfig(prompt_format="chat"))
    assert PromptRenderer(build_tokenizer(), TaskConfig(prompt_format="auto")).format == "raw"


def test_long_prompts_are_refused_cut_or_left_out(tok):
    text = "Ava has 3 apples and Ben has 4. " * 10
    n = len(PromptRenderer(tok, TaskConfig(max_prompt_tokens=4096)).ids(text))
    cut = PromptRenderer(tok, TaskConfig(max_prompt_tokens=20, long_prompts="truncate"))
    kept = cut.fit(cut.ids(text))
    assert len(kept) == 20 and tok.decode(kept).endswith("<|im_start|>assistant\n")  # the end stays whole
    assert PromptRenderer(tok, TaskConfig(max_prompt_tokens=20)).fit(list(range(n))) is None
    assert not PromptRenderer(tok, TaskConfig(max_prompt_tokens=20, long_prompts="skip")).fits(text)


def test_the_validation_pass_counts_tokens_as_the_run_renders_them(local_model, tok):
    from rlgen.plan.checks.inputs import PromptEncoder

    cfg = compose_run_config([f"model.path={local_model / 'model'}", "task.system_prompt=Be brief."])
    text = "Cleo has 12 stamps. How many?"
    assert PromptEncoder(cfg).count(text) == len(PromptRenderer(tok, cfg.task).ids(text))


def test_stop_ids_come_from_the_generation_config(local_model, tok):
    ids = model_stop_ids(str(local_model / "model"), tok, [7])
    assert ids == [tok.eos_token_id, tok.pad_token_id, 7]  # <|im_end|>, <|endoftext|>, the task's own


def test_a_stop_string_ends_the_response_at_the_token_that_completes_it(tok):
    text = "The sum is 7.</answer> and then more words"
    token_ids = tok.encode(text, add_special_tokens=False)
    c = Completion(0, [1], token_ids, [-0.1] * len(token_ids), "length", 3)
    cut, kept = cut_at_stop(c, tok, ["</answer>"], tok.decode(token_ids))
    assert kept.endswith("</answer>") and "more words" not in kept
    assert cut.finish_reason == "stop" and len(cut.logprobs) == len(cut.token_ids) < len(token_ids)
    assert tok.decode(cut.token_ids[:-1]).find("</answer>") == -1  # the shortest prefix that holds it
    same, _ = cut_at_stop(c, tok, ["</nope>"], tok.decode(token_ids))
    assert same is c


# -- data sets ----------------------------------------------------------------------------------------------
def test_gsm8k_rows_from_jsonl_and_parquet(local_model, tmp_path):
    import datasets

    from rlgen.tasks import build_task

    cfg = compose_run_config(["task=gsm8k", f"task.path={local_model / 'train.jsonl'}",
                              f"task.eval_path={local_model / 'test.jsonl'}"]).task
    task = build_task(cfg)
    first = json.loads((local_model / "train.jsonl").read_text().splitlines()[0])
    row = next(r for r in task.rows if r.source.endswith(":0"))
    assert row.text == first["question"] + "\nSolve it step by step, then give the final answer on its own line after ####."
    assert row.answer == first["answer"].rsplit("####", 1)[1].strip()
    assert len(task.rows) == 260 and len(task.eval_prompts()) == 40
    assert task.prompts(3, 8) == build_task(cfg).prompts(3, 8)  # seeded
    parquet = tmp_path / "train.parquet"
    datasets.load_dataset("json", data_files=str(local_model / "train.jsonl"), split="train").to_parquet(str(parquet))
    as_parquet = build_task(compose_run_config(["task=gsm8k", f"task.path={parquet}"]).task)
    assert [r.answer for r in as_parquet.rows] == [r.answer for r in task.rows]


def test_a_folder_of_split_files_and_a_held_out_fraction(local_model, tmp_path):
    from rlgen.tasks import build_task

    (tmp_path / "train.jsonl").write_text((local_model / "train.jsonl").read_text())
    (tmp_path / "test.jsonl").write_text((local_model / "test.jsonl").read_text())
    test = build_task(compose_run_config(["task=gsm8k", f"task.path={tmp_path}", "task.split=test"]).task)
    assert len(test.rows) == 40
    held = build_task(compose_run_config(["task=gsm8k", f"task.path={tmp_path}", "task.eval_fraction=0.1"]).task)
    assert len(held.rows) == 234 and len(held.eval_prompts()) == 26
    assert not {r.text for r in held.rows} & {r.text for r in held.eval_prompts()}


@pytest.mark.parametrize(("overrides", "phrase"), [
    (["task.template=null", "task.prompt_key=query"],
     "the row has no field 'query' (task.prompt_key); its fields are question, answer"),
    (["task.answer_format=boxed"], "no reference answer in 'answer' for task.answer_format=boxed"),
    (['task.template="{questin}"'], "the row has no field 'questin' (task.template)"),
    (["task.split=test"], "task.split=test picks a split file in a folder"),
])
def test_bad_dataset_settings_are_named(local_model, overrides, phrase):
    from rlgen.tasks import build_task

    with pytest.raises(TaskDataError, match=phrase.replace("(", r"\(").replace(")", r"\)")):
        build_task(compose_run_config(["task=gsm8k", f"task.path={local_model / 'train.jsonl'}", *overrides]).task)


# -- the scorer -------------------------------------------------------------------------------------------
def test_a_worker_pool_scores_as_the_driver_does(local_model):
    from rlgen.tasks.rewards import RewardSet
    from rlgen.tasks.scoring import Scorer

    cfg = TaskConfig(rewards={"math": 1.0, "format": 0.1})
    texts = ["#### 7", "\\boxed{7.0}", "7", "#### 8", ""]
    answers = ["7"] * 5
    here = Scorer(RewardSet.from_config(cfg), cfg, "math")
    pooled = Scorer(RewardSet.from_config(cfg), TaskConfig(rewards=cfg.rewards, reward_workers=2), "math")
    try:
        a = here.result(here.submit(texts, answers, ["r"] * 5, 0))
        b = pooled.result(pooled.submit(texts, answers, ["r"] * 5, 0))
    finally:
        pooled.close()
    assert a.totals == b.totals == pytest.approx([1.1, 1.1, 1.0, 0.1, 0.0])
    assert a.parts == b.parts and a.means()["reward/math"] == pytest.approx(0.6)


def test_a_reward_call_that_hangs_scores_zero_and_is_counted(tmp_path, monkeypatch):
    from rlgen.tasks.rewards import RewardSet
    from rlgen.tasks.scoring import Scorer

    (tmp_path / "sleepy_reward.py").write_text(
        "import time\n\ndef score(completion, answer):\n    if completion == 'hang':\n        time.sleep(60)\n"
        "    return 1.0\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setenv("PYTHONPATH", str(tmp_path))  # the spawned workers import it too
    cfg = TaskConfig(reward="sleepy_reward:score", reward_workers=2, reward_timeout_s=1.0)
    scorer = Scorer(RewardSet.from_config(cfg), cfg, cfg.reward)
    try:
        t0 = time.time()
        scores = scorer.result(scorer.submit(["ok", "hang", "ok"], ["1"] * 3, ["r"] * 3, 5))
        assert time.time() - t0 < 20
        assert scores.totals == [1.0, 0.0, 1.0] and scores.timeouts == 1
        again = scorer.result(scorer.submit(["ok"], ["1"], ["r"], 6))  # a fresh pool took the stuck one's place
        assert again.totals == [1.0] and again.timeouts == 0
    finally:
        scorer.close()
