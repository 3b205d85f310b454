"""Dr. GRPO (Liu et al. 2025, "Understanding R1-Zero-Like Training: A Critical Perspective"): GRPO without its two
length and difficulty biases. Advantages are not divided by the group's std (algo.scale_rewards=none), and each
sequence's token sum is divided by the constant max_new_tokens instead of its own length
(algo.loss_agg=seq_mean_token_sum_norm). Those are settings of GRPO's functions; conf/algo/dr_grpo.yaml sets them.
"""

from rlgen.algo.grpo import grpo_advantages, grpo_loss
from rlgen.algo.registry import Algorithm

ALGORITHM = Algorithm("dr_grpo", advantages=grpo_advantages, loss=grpo_loss)
