#!/usr/bin/env bash
# rlgen's GPU end-to-end checks and benchmarks on a CUDA host, stage by stage; everything a stage writes goes
# to WORK_DIR/<stage>, and WORK_DIR is packed into OUT_DIR/results.tgz after every stage (checkpoints left out).
#   usage: benchmarks/gpu_e2e.sh OUT_DIR STAGE[,STAGE...] [WORK_DIR]
# Several invocations can share a host on disjoint GPUs: set CUDA_VISIBLE_DEVICES, LANE=<name> (the tarball
# becomes results-<name>.tgz), a WORK_DIR of its own and E2E_EXCLUSIVE=0 (no host-wide clean-up between stages).
# Each stage runs under its own time limit (seconds, from LIMIT below; override with LIMIT_<stage>=N), so one
# stuck stage cannot eat the others' time. Stages and the GPUs they need:
#   1 GPU : check, tests1 (the one-GPU weight-sync tests: IPC, DeepSpeed), validate (vllm vs hf, 0.5B), learn_colo (tiny
#           model, colocated, reward must rise), time_colo (1.5B, colocated, 20 steps), bench_ipc
#   2 GPUs: tests2 (the two-GPU weight-sync tests), learn_split, time_split (1.5B sync), time_split_async
#           (1.5B async_steps=1), bench_nccl (+ raw NCCL calibration)
#   4 GPUs: run4 (engine=vllm_tp2 hardware=4xh200, 20 steps), sweep4 (num_engines x TP)
# Durable runs and real workloads (their wheelhouse needs the data extra's wheels, named one by one since it
# downloads without dependencies: wheelhouse.sh OUT datasets multiprocess pyarrow pandas xxhash fsspec
# math-verify latex2sympy2_extended python-dateutil tzdata tqdm):
#   1 GPU : gsm8k_colo (a random 0.5B with a BPE tokenizer trained here, the task=gsm8k preset, 5 steps with eval)
#   1 GPU : resume_colo (1.5B colocated, stopped with SIGINT at step 6 and resumed; the stop and end checkpoints
#           give seconds and bytes per checkpoint; keep=1 so two 1.5B checkpoints at most share the disk)
#   2 GPUs: ckpt_split (1.5B: seconds and bytes per checkpoint), resume_split (1.5B stopped with SIGINT at step 6,
#           then resume=<run dir>: DeepSpeed's checkpoint resumed)
set -uo pipefail
out=${1:?usage: gpu_e2e.sh OUT_DIR STAGES [WORK_DIR]}
stages=${2:?usage: gpu_e2e.sh OUT_DIR STAGES [WORK_DIR]}
work=${3:-/tmp/rlgen-e2e}
mkdir -p "$out" "$work"
py=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false VLLM_USE_FLASHINFER_SAMPLER=${VLLM_USE_FLASHINFER_SAMPLER:-0}
declare -A LIMIT=([check]=60 [tests1]=240 [validate]=200 [learn_colo]=240 [time_colo]=350 [bench_ipc]=230
                  [tests2]=180 [learn_split]=150 [time_split]=235 [time_split_async]=235 [bench_nccl]=170
                  [run4]=220 [sweep4]=300 [gsm8k_colo]=420 [ckpt_split]=360 [resume_split]=540 [resume_colo]=570)
# GRPO geometry of the timing runs: long enough responses that generation and training are comparable
shape="algo.prompts_per_step=16 algo.samples_per_prompt=8 algo.max_new_tokens=256 algo.lr=1e-6 \
algo.micro_batch_tokens=5120 task.max_prompt_tokens=64 engine.max_model_len=512"
big="model=qwen2_5_1_5b steps=20 $shape"
small="model=qwen2_5_0_5b steps=5 $shape"
learn="model=tiny steps=100"

tgz="$out/results${LANE:+-$LANE}.tgz"  # LANE: a name for this invocation when several run side by side
pack() { tar czf "$tgz.tmp" -C "$work" --exclude='final_model' --exclude='*.safetensors' \
  --exclude='*.pt' --exclude='*.bin' . 2>/dev/null && mv "$tgz.tmp" "$tgz"; }
trainstage() { local name=$1; shift; stage "$name" "$py" -m rlgen.cli train "hydra.run.dir=$work/$name/run" progress=false "$@"; }

stage() {
  local name=$1; shift
  local limit=${LIMIT[$name]:-300}; local var="LIMIT_$name"; limit=${!var:-$limit}
  mkdir -p "$work/$name"
  echo "== $name (limit ${limit}s) $(date +%T)"
  local t0=$SECONDS
  # its own process group, so a stage that overruns goes down with every process it started
  setsid "$@" > "$work/$name/log.txt" 2>&1 &
  local pid=$!
  ( sleep "$limit"; kill -TERM -- "-$pid" 2>/dev/null; sleep 15; kill -KILL -- "-$pid" 2>/dev/null ) &
  local watch=$!
  wait "$pid"; local rc=$?
  kill "$watch" 2>/dev/null; kill -KILL -- "-$pid" 2>/dev/null
  echo "   $name rc=$rc in $((SECONDS - t0))s"; tail -n 4 "$work/$name/log.txt" | cut -c1-300 | sed 's/^/   | /'
  echo "$name rc=$rc s=$((SECONDS - t0))" >> "$work/stages.txt"
  if [[ $rc != 0 ]]; then  # the actors' own stderr (Ray keeps it in its session folder): last lines of each
    for f in /tmp/ray/session_latest/logs/worker-*.err; do
      [[ -s $f ]] && { echo "--- $f"; tail -n 60 "$f"; }
    done > "$work/$name/ray_workers.txt" 2>/dev/null
  fi
  if [[ ${E2E_EXCLUSIVE:-1} == 1 ]]; then  # alone on this host: clear what escaped the group (Ray, vLLM)
    pkill -9 -f 'raylet|gcs_server|ray::|VLLM::|default_worker.py|dashboard' >/dev/null 2>&1; sleep 2
  fi
  pack
}

run_stage() {
  case "$1" in
    check) stage check bash -c "nvidia-smi; $py -c 'import importlib.metadata as m; [print(p, m.version(p)) for p in (\"vllm\",\"torch\",\"deepspeed\",\"ray\",\"hydra-core\",\"transformers\")]'" ;;
    tests1) stage tests1 "$py" -m pytest tests/gpu/test_weight_sync.py -v -rA -p no:cacheprovider -k "not nccl" ;;
    tests2) stage tests2 "$py" -m pytest tests/gpu/test_weight_sync.py -v -rA -p no:cacheprovider -k "nccl or deepspeed" ;;
    validate) stage validate "$py" -m rlgen.cli validate engine=vllm model=qwen2_5_0_5b hardware=1xh100 \
        "hydra.run.dir=$work/validate/run" ;;
    learn_colo) trainstage learn_colo engine=vllm hardware=1xh100 engine.gpu_memory_utilization=0.08 $learn ;;
    time_colo) trainstage time_colo engine=vllm hardware=1xh100 engine.gpu_memory_utilization=0.35 $big ;;
    bench_ipc) stage bench_ipc bash -c "for m in qwen2_5_0_5b qwen2_5_1_5b; do $py benchmarks/weight_sync_bench.py \
        --hardware 1xh100 --model \$m --bucket-mb 1024 --repeats 4 --out $work/bench_ipc/\$m.json || exit 1; done" ;;
    learn_split) trainstage learn_split engine=vllm hardware=2xh200 engine.gpu_memory_utilization=0.3 ${learn/steps=100/steps=80} ;;
    time_split) trainstage time_split engine=vllm hardware=2xh200 $big ;;
    time_split_async) trainstage time_split_async engine=vllm hardware=2xh200 algo.async_steps=1 $big ;;
    bench_nccl) stage bench_nccl bash -c "for m in qwen2_5_0_5b qwen2_5_1_5b; do $py benchmarks/weight_sync_bench.py \
        --hardware 2xh200 --model \$m --bucket-mb 1024 --repeats 4 --out $work/bench_nccl/\$m.json || exit 1; done; \
        torchrun --nproc-per-node 2 benchmarks/calibrate_nccl_broadcast.py" ;;
    run4) trainstage run4 engine=vllm_tp2 hardware=4xh200 $big ;;
    gsm8k_colo) stage gsm8k_colo bash -c "$py -m rlgen.models.local $work/gsm8k_colo/lm qwen2_5_0_5b 32000 cuda && \
        $py -m rlgen.cli train engine=vllm hardware=1xh100 model.path=$work/gsm8k_colo/lm/model task=gsm8k \
        task.path=$work/gsm8k_colo/lm/data/train.jsonl task.eval_path=$work/gsm8k_colo/lm/data/test.jsonl \
        eval.every=5 eval.max_prompts=64 steps=5 engine.gpu_memory_utilization=0.35 algo.max_new_tokens=256 \
        algo.micro_batch_tokens=8192 algo.lr=1e-6 task.reward_workers=4 progress=false hydra.run.dir=$work/gsm8k_colo/run" ;;
    ckpt_split) stage ckpt_split "$py" benchmarks/checkpoint_cost.py "$work/ckpt_split" engine=vllm hardware=2xh200 \
        $big steps=12 checkpoint.every=4 ;;
    resume_split) stage resume_split "$py" benchmarks/resume_check.py "$work/resume_split" 6 engine=vllm \
        hardware=2xh200 $big steps=12 checkpoint.every=0 ;;
    resume_colo) stage resume_colo "$py" benchmarks/resume_check.py "$work/resume_colo" 6 engine=vllm \
        hardware=1xh100 engine.gpu_memory_utilization=0.35 $big steps=12 checkpoint.every=0 checkpoint.keep=1 ;;
    sweep4) stage sweep4 "$py" -m rlgen.cli train -m engine=vllm hardware=4xh200 \
        engine.num_engines=1,2 engine.tensor_parallel_size=1,2 \
        "hydra.sweep.dir=$work/sweep4/sweep" progress=false $small ;;
    *) echo "unknown stage $1"; return 2 ;;
  esac
}

IFS=, read -ra todo <<< "$stages"
for s in "${todo[@]}"; do run_stage "$s"; done
cat "$work/stages.txt"
