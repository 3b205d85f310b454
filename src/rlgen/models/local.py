"""A Hugging Face model folder made on this machine, with no hub: a byte-level BPE tokenizer trained on given
texts with ``tokenizers``, a ChatML chat template, and a randomly initialised Qwen2 model of a preset's shape.
It loads like any downloaded instruct model (``model.path=<folder>``), which is what offline tests and GPU
benchmarks need. ``gsm8k_like`` writes GSM8K-shaped rows to train on.

    python -m rlgen.models.local OUT_DIR [preset] [vocab_size]      # e.g. qwen2_5_0_5b 32000; rows in OUT_DIR/data
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

from rlgen.config import ModelConfig
from rlgen.config.compose import compose_run_config
from rlgen.rope import rope_parameters

PAD, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
CHAT_TEMPLATE = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>'"
    " + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)

_NAMES = ["Ava", "Ben", "Cleo", "Dev", "Eli", "Fay", "Gus", "Hana", "Ivo", "Jade"]
_THINGS = ["apples", "pencils", "stamps", "marbles", "books", "shells", "coins", "cards"]


def gsm8k_like(n: int, seed: int = 0) -> list[dict[str, str]]:
    """n GSM8K-shaped rows: a word problem, and a worked solution ending in "#### <answer>"."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        name, thing = rng.choice(_NAMES), rng.choice(_THINGS)
        a, b, c = rng.randrange(2, 50), rng.randrange(2, 50), rng.randrange(2, 9)
        total = (a + b) * c
        rows.append({
            "question": f"{name} has {a} {thing} and gets {b} more. Then {name} makes the pile {c} times as big. "
                        f"How many {thing} does {name} have now?",
            "answer": f"{name} first has {a}+{b}={a + b} {thing}. Then {a + b}*{c}={total}.\n#### {total}",
        })
    return rows


def train_tokenizer(texts: list[str], vocab_size: int):
    """A byte-level BPE tokenizer trained on texts, with ChatML special tokens and chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    core = Tokenizer(models.BPE())
    core.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    core.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[PAD, IM_START, IM_END],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    core.train_from_iterator(texts, trainer=trainer)
    tok = PreTrainedTokenizerFast(tokenizer_object=core, pad_token=PAD, eos_token=IM_END,
                                  clean_up_tokenization_spaces=False)
    tok.chat_template = CHAT_TEMPLATE
    return tok


def build_folder(out: str | Path, preset: ModelConfig, texts: list[str], vocab_size: int = 2000, seed: int = 0,
                 device: str = "cpu") -> Path:
    """Write tokenizer, config and random weights (bf16 above 100M parameters, else fp32) into out."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig, Qwen2Config

    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    tok = train_tokenizer(texts, vocab_size)
    config = Qwen2Config(
        vocab_size=len(tok), hidden_size=preset.hidden_size, intermediate_size=preset.intermediate_size,
        num_hidden_layers=preset.num_layers, num_attention_heads=preset.num_heads,
        num_key_value_heads=preset.num_kv_heads, max_position_embeddings=preset.max_position_embeddings,
        tie_word_embeddings=preset.tie_word_embeddings,
        rope_parameters=rope_parameters(preset.rope_theta, preset.max_position_embeddings, preset.yarn_factor),
        pad_token_id=tok.pad_token_id, eos_token_id=tok.eos_token_id, bos_token_id=None,
    )
    big = preset.hidden_size * preset.num_layers >= 896 * 24
    with torch.random.fork_rng(devices=[] if device == "cpu" else None):
        torch.manual_seed(seed)
        with torch.device(device):
            model = AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16 if big else torch.float32)
    # An instruct model stops at the end of its turn, and at the end of text.
    model.generation_config = GenerationConfig(eos_token_id=[tok.eos_token_id, tok.pad_token_id],
                                               pad_token_id=tok.pad_token_id)
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def main(argv: list[str]) -> int:
    out = Path(argv[0])
    preset = compose_run_config([f"model={argv[1]}"] if len(argv) > 1 else []).model
    vocab = int(argv[2]) if len(argv) > 2 else 2000
    rows = gsm8k_like(4000, seed=0)
    data = out / "data"
    data.mkdir(parents=True, exist_ok=True)
    for name, part in (("train.jsonl", rows[:3600]), ("test.jsonl", rows[3600:])):
        (data / name).write_text("".join(json.dumps(r) + "\n" for r in part))
    texts = [r["question"] + "\n" + r["answer"] for r in rows]
    device = "cuda" if len(argv) > 3 and argv[3] == "cuda" else "cpu"
    build_folder(out / "model", preset, texts, vocab_size=vocab, device=device)
    print(f"model: {out / 'model'}\ndata: {data}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
