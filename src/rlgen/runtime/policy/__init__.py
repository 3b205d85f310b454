"""The policy between steps: what changes while a run runs (``state``: the version, async steps), how the
learner's new weights reach every engine (``weight_transports``) and the circuit breaker that watches the
trainer/engine mismatch (``breaker``)."""
