"""DAPO (Yu et al. 2025, "DAPO: An Open-Source LLM Reinforcement Learning System at Scale"): GRPO's surrogate with
- clip-higher: a wider upper clip (algo.clip_high=0.28 against clip_low=0.2);
- a token-level loss (algo.loss_agg=token_mean): every token of the batch weighs the same;
- dynamic sampling (algo.dynamic_sampling): groups whose rewards are all equal are dropped and more prompts are
  generated until the batch is full (rlgen.runtime.rollouts.refill);
- overlong reward shaping (algo.overlong_buffer, algo.overlong_penalty) and overlong filtering
  (algo.mask_truncated), applied to the rewards and the batch on the driver;
- no KL term (algo.kl_coef=0).
The maths on the learner are GRPO's functions with those settings; conf/algo/dapo.yaml sets them.
"""

from rlgen.algo.grpo import grpo_advantages, grpo_loss
from rlgen.algo.registry import Algorithm

ALGORITHM = Algorithm("dapo", advantages=grpo_advantages, loss=grpo_loss)
