"""What changes while a run runs: the one value the loop updates and a checkpoint saves (``run_state``: the step,
the policy version, async steps) and the circuit breaker that watches the trainer/engine mismatch (``breaker``).
How the learner's new weights reach every engine is ``rlgen.sync``."""
