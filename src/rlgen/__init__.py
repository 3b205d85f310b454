"""rlgen: fast, correct rollout generation for RL training of LLMs."""

__version__ = "0.1.0"
