#!/usr/bin/env bash
# Weight sync and the DeepSpeed learner on a CUDA host, in one go; logs and JSON go to OUT_DIR.
#   usage: benchmarks/weight_sync_session.sh OUT_DIR [STAGES]   (STAGES: comma list, default all)
#   stages: unit (CPU tests of sync + learner), gpu (tests/gpu/test_weight_sync.py), bench_nccl (2 GPUs),
#           bench_ipc (1 GPU), train_colocated (1 GPU), train_split (2 GPUs)
set -uo pipefail
out=${1:?usage: weight_sync_session.sh OUT_DIR [STAGES]}
stages=${2:-unit,gpu,bench_nccl,bench_ipc,train_colocated,train_split}
mkdir -p "$out"
py=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false VLLM_USE_FLASHINFER_SAMPLER=${VLLM_USE_FLASHINFER_SAMPLER:-0}
ngpu=$(nvidia-smi -L 2>/dev/null | wc -l)
has() { [[ ",$stages," == *",$1,"* ]]; }
run() { local name=$1; shift; echo "== $name: $*"; ( time "$@" ) > "$out/$name.log" 2>&1; echo "   rc=$? ($out/$name.log)"; }

has unit && run unit "$py" -m pytest tests/unit/test_sync.py tests/unit/test_deepspeed_learner.py -q -rs -p no:cacheprovider
has gpu && run gpu "$py" -m pytest tests/gpu/test_weight_sync.py -v -s -rA -p no:cacheprovider
if [[ $ngpu -ge 2 ]] && has bench_nccl; then
  run bench_nccl "$py" benchmarks/weight_sync_bench.py --hardware 2xh200 --model qwen2_5_1_5b --out "$out/sync_nccl.json"
  run calibrate_nccl torchrun --nproc-per-node 2 benchmarks/calibrate_nccl_broadcast.py
fi
has bench_ipc && run bench_ipc "$py" benchmarks/weight_sync_bench.py --hardware 1xh100 --model qwen2_5_1_5b --out "$out/sync_ipc.json"
small="model=qwen2_5_0_5b steps=20 algo.prompts_per_step=32 algo.samples_per_prompt=8 algo.max_new_tokens=256 task.max_prompt_tokens=64"
has train_colocated && run train_colocated "$py" -m rlgen.cli train engine=vllm hardware=1xh100 engine.gpu_memory_utilization=0.35 $small
if [[ $ngpu -ge 2 ]] && has train_split; then
  run train_split "$py" -m rlgen.cli train engine=vllm hardware=2xh200 $small
  run train_split_async "$py" -m rlgen.cli train engine=vllm hardware=2xh200 algo.async_steps=1 $small
fi
