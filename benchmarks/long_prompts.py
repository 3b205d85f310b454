"""A data set of long prompts for runs at reasoning and agent lengths: rows of {"prompt", "answer"} whose prompts
are long runs of words (a seeded draw from a small lexicon), more words than --tokens. A tokenizer that splits on
whitespace first (a BPE one) makes at least one token a word, and the presets' character tokenizer one a
character, so
`task.long_prompts=truncate task.max_prompt_tokens=N` gives every prompt exactly its last N tokens. The answers
are short numbers; a random-weight model's reward is beside the point here.

    python benchmarks/long_prompts.py OUT/long.jsonl --rows 4 --tokens 122880
    rlgen train task=jsonl task.path=OUT/long.jsonl task.long_prompts=truncate task.max_prompt_tokens=122880 ...
"""

from __future__ import annotations

import argparse
import json
import random
from pathlib import Path

LEXICON = ("alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo",
           "lima", "mike", "november", "oscar", "papa", "quebec", "romeo", "sierra", "tango", "uniform", "victor",
           "whiskey", "xray", "yankee", "zulu", "one", "two", "three", "four", "five", "six", "seven", "eight")


def long_rows(rows: int, tokens: int, seed: int) -> list[dict[str, str]]:
    """rows prompts of more than tokens words, each ending in a question, with its numeric answer."""
    rng = random.Random(seed)
    out = []
    for _ in range(rows):
        words = " ".join(rng.choice(LEXICON) for _ in range(tokens + tokens // 20 + 16))
        a, b = rng.randrange(100), rng.randrange(100)
        out.append({"prompt": f"{words}. What is {a} + {b}?", "answer": str(a + b)})
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("out", help="the .jsonl file to write")
    ap.add_argument("--rows", type=int, default=4)
    ap.add_argument("--tokens", type=int, default=122880, help="the prompt tokens the run keeps (truncated to)")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    path = Path(args.out)
    path.parent.mkdir(parents=True, exist_ok=True)
    rows = long_rows(args.rows, args.tokens, args.seed)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    print(f"{len(rows)} rows of about {sum(len(r['prompt']) for r in rows) // len(rows):,} characters -> {path}")


if __name__ == "__main__":
    main()
