"""GSPO (Zheng et al. 2025, "Group Sequence Policy Optimization"): the importance ratio and its clip are per
sequence, s_i = (pi(y_i|x) / pi_old(y_i|x))^(1/|y_i|), the geometric mean of its tokens' ratios
(algo.importance_level=sequence), and the loss is a mean over sequences (algo.loss_agg=seq_mean_token_mean). The
clip range is narrow, as the paper's: 3e-4 below and 4e-4 above. GRPO's functions compute it with those
settings; conf/algo/gspo.yaml sets them.
"""

from rlgen.algo.grpo import grpo_advantages, grpo_loss
from rlgen.algo.registry import Algorithm

ALGORITHM = Algorithm("gspo", advantages=grpo_advantages, loss=grpo_loss)
