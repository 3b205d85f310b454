"""Algorithms (``registry``: found by ``algo.kind``) and their maths: ``grpo`` holds group advantages, token
logprobs, loss aggregation, the clipped policy loss and the k3 KL, which other algorithms reuse."""
