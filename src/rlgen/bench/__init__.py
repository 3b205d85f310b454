"""`rlgen bench`: one RL-shaped generation workload, run on several engines side by side in one process."""

from rlgen.bench.raw import RawVLLM, run_raw_side
from rlgen.bench.run import main, ratios, run_bench
from rlgen.bench.sides import hf_chunks, run_hf_side, run_vllm_side
from rlgen.bench.workload import (
    HF_LOGIT_BYTES,
    HF_MEMORY_FRACTION,
    BenchError,
    check_completions,
    make_workload,
    response_lengths,
    workload_summary,
)

__all__ = [
    "HF_LOGIT_BYTES",
    "HF_MEMORY_FRACTION",
    "BenchError",
    "RawVLLM",
    "check_completions",
    "hf_chunks",
    "main",
    "make_workload",
    "ratios",
    "response_lengths",
    "run_bench",
    "run_hf_side",
    "run_raw_side",
    "run_vllm_side",
    "workload_summary",
]
