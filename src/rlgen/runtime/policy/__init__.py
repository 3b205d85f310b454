"""The policy between steps: what changes while a run runs (``state``: the version, async steps) and the circuit
breaker that watches the trainer/engine mismatch (``breaker``). How the learner's new weights reach every engine
is ``rlgen.sync``."""
