"""What a run reports: the JSONL/rich/wandb sink (``sink``), engine-vs-trainer logprob mismatch (``mismatch``),
the balance verdict of each step (``balance``, with what carrying the generation tail would save: ``tail_gain``,
and the advice that names more engines or GPUs: ``room_advice``), a series of step times as throughput and spread
(``steady``) and the PNG report (``report``)."""
