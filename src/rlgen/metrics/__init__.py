"""What a run reports: the JSONL/rich/wandb sink (``sink``), engine-vs-trainer logprob mismatch (``mismatch``),
the balance verdict of each step (``balance``) and the PNG report (``report``)."""
