"""One training step, a module per phase, in the order ``runtime.loop`` calls them: ``generate`` (the step's flight
collected), ``score`` (rewards, shaped, refilled by dynamic sampling, padded into the batch's rows), ``advantages``
(the one place the step's advantages are computed), ``train`` (the learner group's optimizer step, on each rank's
``shards``), ``sync`` (colocated engines asleep and awake, the breaker, the new version to the engines) and
``record`` (held-out evaluation, the step's line of metrics.jsonl with its balance verdict)."""
