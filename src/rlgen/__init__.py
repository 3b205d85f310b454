"""rlgen: fast, correct rollout generation for RL training of LLMs."""

import time

__version__ = "0.1.0"
STARTED_AT = time.time()  # about when this process started: time to the first rollout counts from here
