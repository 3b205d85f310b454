#!/usr/bin/env bash
# rlgen's GPU checks and benchmarks on a CUDA host, one stage per invocation; logs and JSON go to OUT_DIR.
#   usage: benchmarks/gpu_session.sh STAGE OUT_DIR [ARGS ...]
#   stages:
#     check            versions, the GPU, and that vllm/ray/hydra import
#     test             the GPU tests (tests/gpu)
#     bench [OVERRIDES]  `python -m rlgen.bench` on the qwen2_5_1_5b preset (vllm, hf, vllm_raw)
#     tune POINTS [OVERRIDES]  benchmarks/vllm_tune.py over comma-separated points
#     smoke [OVERRIDES]  `make smoke-gpu`'s run, timed from launch; its reward curve (benchmarks/learning_curve.py)
#     core-kill [OVERRIDES]  SIGKILL of vLLM's engine core at step 3 of 10 (benchmarks/kill_engine_core.py)
#     ckpt-cost [OVERRIDES]  a 1.5B run's checkpoint cost to the loop: two in the background, the last one not
#     startup [OVERRIDES]  the 0.5B one-liner twice (empty caches, then warm): its start-up phases (startup.jsonl)
#     lora [OVERRIDES]  full fine-tuning, LoRA through vLLM adapters and LoRA merged at 1.5B, side by side
#                       (benchmarks/lora_compare.py); then the adapter side's final adapter checked by
#                       `rlgen validate` both ways
#     trl-serve [ARGS]  TRL's GRPOTrainer in server mode against `rlgen serve` (benchmarks/trl_serve.py; --gpus 2 on
#                       two GPUs: weights over TRL's NCCL path)
#     lora-7b [OVERRIDES]  the 7B one-liner as typed (5 steps): LoRA picked by the plan, its sync by `auto`; its
#                       mean step after the first, the steps' spread (max/min) and tokens/s (the median beside)
#     lora-kept [OVERRIDES]  one GPU: `model=small learner.lora.rank=8` as typed, its adapters sent as adapters and
#                       merged, each run twice: the first keeps its engines warm, the second takes them over (the
#                       lines it ends with, any traceback, and each run's first rollout)
#     lora-validate [ARGS]  a 0.5B LoRA adapter with random lora_B (benchmarks/random_adapter.py ARGS), then
#                       `rlgen validate` of it both ways: vLLM's adapter kernels and merged weights
#     serve-nccl [TRAIN_OVERRIDES]  two GPUs: `rlgen serve` (0.5B) on GPU 0, then two `rlgen train engine=remote` jobs
#                       on GPU 1, one after the other, weights over NCCL (benchmarks/serve_remote.py)
#     nccl-kill [OVERRIDES]  two GPUs: the engine's vLLM core killed inside the NCCL update of step 3; the run
#                       must finish (benchmarks/kill_in_nccl_update.py)
#     nccl-env         two GPUs: NCCL joins with NCCL_CUMEM_ENABLE set alike and unlike (benchmarks/nccl_cumem_check.py)
#     tool-latency [ARGS]  single-turn, multi-turn, and multi-turn with a 50-500 ms tool, one after the other on the
#                       0.5B (benchmarks/tool_latency.py)
#     layouts HW [OVERRIDES]  the 1.5B on this host's GPUs (hardware=HW, e.g. 2xh100): hybrid (every GPU trains and
#                       generates) and the split, TP 1 and 2, as one sweep with its summary (GPU busy, first rollout)
#     learner-speed [ARGS]  four GPUs: benchmarks/learner_speed.py, micro-batch and checkpointing variants, one GPU
#                       each at once; then four ranks as one ZeRO-2 group
#     scaling [OVERRIDES]  four GPUs: the 1.5B as typed (the plan picks the layout), 6 steps each, on one and two
#                       GPUs side by side, then on four
#     nccl-split [OVERRIDES]  three GPUs: one learner rank sending to two engines of their own over NCCL (the 1.5B,
#                       16 prompts a step)
#     tp2-split [OVERRIDES]  four GPUs: the 1.5B with one TP-2 engine on two GPUs and two learner ranks on the others,
#                       weights over NCCL while the engine generates (8 steps)
#     headline [OVERRIDES]  four GPUs: `rlgen train engine=vllm_tp2 hardware=4xh100 model=qwen2_5_1_5b steps=20`
#     headline-sweep [OVERRIDES]  four GPUs: the headline's sweep, `-m engine.num_engines=1,2
#                       engine.tensor_parallel_size=1,2`, with its summary (OUT/sweep/sweep_summary.md)
#     lengths [OVERRIDES]  one GPU: the padding pair, the 0.5B with 512 sequences a step, every response 256 tokens
#                       against RL-shaped lengths (cap 2,048, mean about 256: task.response_length_mean), then the
#                       learner alone (benchmarks/learner_speed.py, the 1.5B at the plan's token budget, both lengths);
#                       benchmarks/lengths_report.py gives each run's mean step, its spread and tokens/s
#     tail [ARGS]      one GPU: benchmarks/peer_trl.py's small shape (64 sequences a step), fixed 256 against RL-shaped
#                       lengths (cap 2,048, mean about 256), and TRL's GRPOTrainer on the RL-shaped ones: each
#                       side's mean step, its spread (max/min), tokens/s and the ratio of means to TRL's
#     partial [ARGS]   two GPUs side by side: on GPU 0 the padding pair of `lengths`, and its RL-shaped run again
#                       with algo.partial_rollouts=0.25, then 0.5 with algo.partial_max_steps=2; on GPU 1 the small
#                       shape of `tail`, fixed against RL-shaped without and with partial rollouts (side
#                       rlgen_partial), and TRL's GRPOTrainer on the RL-shaped lengths
#     pace [OVERRIDES]  one GPU: the padding pair of `lengths` (10 steps, PACE_STEPS) at two sets of stop ids
#                       (task.seed 0 and 7), each RL-shaped run without and with partial rollouts (0.5, two
#                       carries), seed 0 also with algo.launch_ahead=step_start, and benchmarks/lengths_report.py
#                       over every run OUT holds; PACE_RUNS names a part of the runs, to split them over calls
#     precision [OVERRIDES]  one GPU: bf16 against fp16 (make smoke-gpu's run and the 0.5B padding pair's fixed run each
#                       way): reward curves, mismatch by length, overflow and non-finite skips
#     invariance [OVERRIDES]  one GPU: deterministic=true: tests/gpu/test_batch_invariance.py (INV_TEST=0: not), then
#                       model=small and the 0.5B's fixed run ($INV_SHAPES) each twice with one seed (benchmarks/same_run.py
#                       compares their metrics and batch digests) and once without the mode (the cost in tokens/s);
#                       $INV_PROMPTS prompts a step for the 0.5B (64)
#     distill [OVERRIDES]  one GPU: model=small trained by RL ($TEACHER_STEPS, 300 steps) as the teacher, then 150 steps
#                       of algo=distill from the same start with each of $DISTILL_ESTIMATORS ("sampled full"),
#                       against RL alone (benchmarks/distill_report.py)
#     peer-shapes [ARGS]  one GPU: benchmarks/peer_trl.py at RL-shaped lengths for each PROMPTS:CAP:MEAN in $SHAPES
#                       (default "8:2048:256 4:4096:512"), sides rlgen_async, rlgen_partial and TRL's GRPOTrainer
#                       ($PEER_SIDES names others, e.g. rlgen:own_in:algo.async_steps=1,algo.launch_ahead=own_in)
#     long [OVERRIDES]  one GPU: the 1.5B with 32k-token responses (every response at its cap), 3 steps, at the plan's
#                       token budget: its step breakdown and the learner's peak memory against the plan's
#     long-7b [OVERRIDES]  two GPUs: the 7B with 16k-token responses, 3 steps, likewise
#     learner-long     one GPU: the learner alone at reasoning lengths (benchmarks/learner_speed.py, a variant a process): the 0.5B at one
#                       65,536-token micro-batch, as one sequence and as 16 of 4,096, then the 1.5B at one 131,072-token
#                       sequence; tokens/s, MFU and the peak beside the plan's memory model of the same rank
#     long-131k [OVERRIDES]  one GPU: 131,072-token sequences end to end: the 1.5B (YaRN x4, from the plan) on
#                       122,880-token prompts (benchmarks/long_prompts.py, truncated to their last tokens) and 8,192-token
#                       responses, 3 steps: the step breakdown, the learner's peak against the plan's, mismatch by length
#     long-7b-65k [OVERRIDES]  one GPU: the 7B at 65,536 tokens (61,440-token prompts, 4,096-token responses) with LoRA
#                       (the plan's), 3 steps, likewise
#     mismatch-length [ARGS]  one GPU: `rlgen validate engine=vllm model=qwen2_5_1_5b` at 1k, 16k, 64k and 128k tokens
#                       (validate.length), two cases of one request each: k3 KL and |dlogp| against the HF reference;
#                       $LENGTHS names other lengths, $MODEL another preset
#     serve-lora ADAPTER [OVERRIDES]  `rlgen serve` with vLLM adapters: load, generate with and without, unload
#                       (benchmarks/serve_lora.py)
# Run from the repository root with rlgen importable (installed, or src on PYTHONPATH). Every vLLM process is
# started by Python code kept under `if __name__ == "__main__":`, as vLLM's spawned engine cores need.
set -uo pipefail
stage=${1:?usage: gpu_session.sh STAGE OUT_DIR [ARGS ...]}
out=${2:?usage: gpu_session.sh STAGE OUT_DIR [ARGS ...]}
shift 2
mkdir -p "$out"
py=${PYTHON:-python3}
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false

case "$stage" in
  check)
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv | tee "$out/check.log"
    "$py" - <<'EOF' 2>&1 | tee -a "$out/check.log"
import importlib.metadata as md
import torch
for pkg in ("vllm", "torch", "transformers", "ray", "hydra-core"):
    print(pkg, md.version(pkg))
import vllm, ray, hydra  # noqa: F401
print("cuda", torch.version.cuda, torch.cuda.get_device_name(0))
EOF
    ;;
  test)
    "$py" -m pytest tests/gpu -v -s -rA -p no:cacheprovider 2>&1 | tee "$out/test.log"
    ;;
  bench)
    "$py" -m rlgen.bench engine=vllm model=qwen2_5_1_5b hardware=1xh100 "$@" --out "$out/bench" 2>&1 | tee "$out/bench.log"
    ;;
  layouts)
    hw=${1:?usage: gpu_session.sh layouts OUT_DIR HW [OVERRIDES]}
    shift
    "$py" -m rlgen.cli train -m hardware="$hw" model=qwen2_5_1_5b engine=vllm,vllm_tp2 hardware.colocated=true,false \
      engine.keep_warm_s=0 progress=false "$@" hydra.sweep.dir="$out/layouts-$hw" 2>&1 | tee "$out/layouts-$hw.log"
    ;;
  tool-latency)
    "$py" benchmarks/tool_latency.py "$out/tool_latency" engine=vllm model=qwen2_5_0_5b hardware=1xh100 "$@" 2>&1 | tee "$out/tool_latency.log"
    ;;
  tune)
    points=${1:?tune needs POINTS}
    shift
    "$py" benchmarks/vllm_tune.py --out "$out/tune.json" --points "$points" "$@" 2>&1 | tee "$out/tune.log"
    ;;
  smoke)
    launch=$(date +%s.%N)
    "$py" -m rlgen.cli train engine=vllm hardware=1xh100 model=small steps=150 hydra.run.dir="$out/smoke" "$@" \
      2>&1 | tee "$out/smoke.log"
    "$py" benchmarks/learning_curve.py "$out/smoke" --launch "$launch" --out "$out/smoke.json" --png "$out/smoke.png"
    ;;
  core-kill)
    "$py" benchmarks/kill_engine_core.py "$out/core-kill" "$@" 2>&1 | tee "$out/core-kill.log"
    ;;
  startup)
    # the 0.5B one-liner as typed, twice: the first on this host's empty caches, the second with them
    for run in cold warm; do
      "$py" -m rlgen.cli train engine=vllm hardware=1xh100 model=qwen2_5_0_5b steps=2 \
        hydra.run.dir="$out/startup-$run" "$@" > "$out/startup-$run.log" 2>&1
      "$py" -c 'import json, sys; s = json.load(open(sys.argv[1])); print(sys.argv[2], json.dumps(s["startup"]))' \
        "$out/startup-$run/summary.json" "$run" | tee -a "$out/startup.jsonl"
    done
    ;;
  ckpt-cost)
    "$py" -m rlgen.cli train engine=vllm hardware=1xh100 model=qwen2_5_1_5b steps=6 checkpoint.every=2 \
      algo.prompts_per_step=8 algo.max_new_tokens=64 checkpoint.keep=1 hydra.run.dir="$out/ckpt" "$@" 2>&1 \
      | tee "$out/ckpt.log"
    "$py" - "$out/ckpt/summary.json" <<'EOF2' | tee -a "$out/ckpt.log"
import json, sys
s = json.load(open(sys.argv[1]))
print(json.dumps({"checkpoint_seconds": s["checkpoint_seconds"],
                  "note": "steps 2 and 4 in the background; the last is the final one, written while the run waits"}))
EOF2
    ;;
  lora)
    "$py" benchmarks/lora_compare.py "$out/lora" full,adapter,merged engine=vllm hardware=1xh100 model=qwen2_5_1_5b \
      steps=8 algo.max_new_tokens=256 "$@" 2>&1 | tee "$out/lora.log"
    rm -rf "$out/lora/full/checkpoints" "$out/lora/full/final_model"  # 25 GB of full fine-tuning state
    for sync in adapter merged; do
      "$py" -m rlgen.cli validate engine=vllm hardware=1xh100 model=qwen2_5_1_5b \
        learner.lora.init="$out/lora/adapter/final_model" learner.lora.sync=$sync hydra.run.dir="$out/validate-$sync" \
        > "$out/validate-$sync.log" 2>&1
      echo "validate $sync: exit $?" | tee -a "$out/lora.log"
    done
    ;;
  lora-kept)
    for sync in adapter merged; do
      for run in first second; do
        "$py" -m rlgen.cli train engine=vllm hardware=1xh200 model=small learner.lora.rank=8 \
          learner.lora.sync=$sync hydra.run.dir="$out/lora-$sync-$run" "$@" > "$out/lora-$sync-$run.log" 2>&1
        echo "lora $sync $run: exit $?, $(grep -c Traceback "$out/lora-$sync-$run.log") tracebacks" \
          | tee -a "$out/lora-kept.log"
        tail -n 4 "$out/lora-$sync-$run.log" | tee -a "$out/lora-kept.log"
        "$py" -c 'import json, sys; s = json.load(open(sys.argv[1])); print(json.dumps({k: s.get(k) for k in
          ("first_rollout_s", "setup_s", "reward_first_20pct", "reward_last_20pct")}))' \
          "$out/lora-$sync-$run/summary.json" | tee -a "$out/lora-kept.log"
      done
    done
    ;;
  trl-serve)
    "$py" benchmarks/trl_serve.py "$out/trl-serve" "$@" 2>&1 | tee "$out/trl-serve.log"
    ;;
  lora-7b)
    "$py" -m rlgen.cli train engine=vllm hardware=1xh100 model=qwen2_5_7b steps=5 hydra.run.dir="$out/lora-7b" "$@" \
      2>&1 | tee "$out/lora-7b.log"
    "$py" - "$out/lora-7b" <<'EOF3' | tee -a "$out/lora-7b.log"
import json, statistics, sys
from pathlib import Path
from rlgen.metrics.steady import steady
run = Path(sys.argv[1])
s = json.loads((run / "summary.json").read_text())
steps = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
later = steps[1:] or steps
st = steady([m["step_s"] for m in steps], [m["response_tokens"] for m in steps], warmup=1 if len(steps) > 1 else 0)
print(json.dumps({"steps": len(steps), "mean_step_s": st and st.mean_s, "step_spread": st and st.spread,
                  "tokens_per_s": st and st.tokens_per_s, "median_step_s": st and st.median_s,
                  "mean_sync_s": statistics.fmean(m["sync_s"] for m in later),
                  "learner_peak_gib": max(m.get("learner_peak_gib", 0) for m in steps),
                  "mismatch_mean_abs_delta": statistics.mean(m["mismatch/mean_abs_delta"] for m in steps),
                  "first_rollout_s": s.get("first_rollout_s"),
                  "lora_sync": json.loads((run / "plan.json").read_text())["config"]["learner"]["lora"]["sync"]}))
EOF3
    ;;
  lora-validate)
    # an adapter with random lora_B: one trained on a random-init model gets no reward and stays at zero
    "$py" benchmarks/random_adapter.py "$out/adapter" --preset qwen2_5_0_5b "$@" 2>&1 | tee "$out/lora-validate.log"
    for sync in adapter merged; do
      "$py" -m rlgen.cli validate engine=vllm hardware=1xh100 model=qwen2_5_0_5b learner.lora.init="$out/adapter" \
        learner.lora.sync=$sync hydra.run.dir="$out/validate-$sync" > "$out/validate-$sync.log" 2>&1
      echo "validate $sync: exit $?" | tee -a "$out/lora-validate.log"
    done
    ;;
  serve-nccl)
    "$py" benchmarks/serve_remote.py --server-gpus 0 --train-gpus 1 --trainers 2 "$out/serve-nccl" engine=vllm \
      hardware=1xh100 model=qwen2_5_0_5b engine.gpu_memory_utilization=0.5 engine.max_model_len=1024 -- \
      hardware=1xh100 model=qwen2_5_0_5b engine.weights_over=nccl steps=6 algo.max_new_tokens=256 "$@" \
      2>&1 | tee "$out/serve-nccl.log"
    ;;
  nccl-kill)
    "$py" benchmarks/kill_in_nccl_update.py "$out/nccl-kill" "$@" 2>&1 | tee "$out/nccl-kill.log"
    ;;
  nccl-env)
    "$py" benchmarks/nccl_cumem_check.py 2>&1 | tee "$out/nccl-env.log"
    ;;
  serve-lora)
    adapter=${1:?serve-lora needs an adapter folder}; shift
    "$py" -m rlgen.cli serve engine=vllm hardware=1xh100 model=qwen2_5_1_5b engine.max_lora_rank=16 serve.port=8011 \
      hydra.run.dir="$out/serve" "$@" > "$out/serve.log" 2>&1 &
    server=$!
    "$py" benchmarks/serve_lora.py http://127.0.0.1:8011 "$adapter" "$out/serve_lora.json" 2>&1 | tee "$out/serve_lora.log"
    kill -INT "$server"
    for _ in $(seq 30); do kill -0 "$server" 2>/dev/null || break; sleep 1; done
    kill -9 "$server" 2>/dev/null || true
    ;;
  lengths)
    # the same engine settings (max_model_len) in both runs, so the second starts from the first's kept engines
    base=(engine=vllm hardware=1xh200 model=qwen2_5_0_5b algo.prompts_per_step=64 steps=6 engine.max_model_len=2064
          progress=false)
    "$py" -m rlgen.cli train "${base[@]}" algo.max_new_tokens=256 hydra.run.dir="$out/pad-fixed" "$@" \
      > "$out/pad-fixed.log" 2>&1
    "$py" -m rlgen.cli train "${base[@]}" algo.max_new_tokens=2048 task.response_length_mean=256 \
      hydra.run.dir="$out/pad-rl" "$@" > "$out/pad-rl.log" 2>&1
    "$py" -m ray.scripts.scripts stop --force > /dev/null 2>&1  # the kept engines give the learner its GPU back
    "$py" benchmarks/lengths_report.py "$out/pad-fixed" "$out/pad-rl" --out "$out/padding.json" | tee "$out/padding.log"
    "$py" benchmarks/learner_speed.py --variants plan:ckpt --lengths rl,fixed --out "$out/learner.json" \
      2>&1 | grep '^{' | tee "$out/learner.log"
    ;;
  tail)
    "$py" benchmarks/peer_trl.py "$out/tail-fixed" --sides rlgen_async --new-tokens 256 --steps 10 --hardware 1xh200 \
      "$@" 2>&1 | tee "$out/tail-fixed.log"
    "$py" benchmarks/peer_trl.py "$out/tail-rl" --model "$out/tail-fixed/model" --sides rlgen_async,trl --new-tokens 2048 \
      --mean-tokens 256 --steps 10 --hardware 1xh200 "$@" 2>&1 | tee "$out/tail-rl.log"
    for side in tail-fixed/rlgen_async tail-rl/rlgen_async; do echo "$out/$side/run"; done \
      | xargs "$py" benchmarks/lengths_report.py --out "$out/tail.json" | tee "$out/tail.log"
    ;;
  partial)
    (
      export CUDA_VISIBLE_DEVICES=0 RAY_TMPDIR=/tmp/ray-partial-0
      base=(engine=vllm hardware=1xh200 model=qwen2_5_0_5b algo.prompts_per_step=64 steps=6 engine.max_model_len=2064
            progress=false)
      rl=(algo.max_new_tokens=2048 task.response_length_mean=256)
      "$py" -m rlgen.cli train "${base[@]}" algo.max_new_tokens=256 hydra.run.dir="$out/pad-fixed" "$@" \
        > "$out/pad-fixed.log" 2>&1
      "$py" -m rlgen.cli train "${base[@]}" "${rl[@]}" hydra.run.dir="$out/pad-rl" "$@" > "$out/pad-rl.log" 2>&1
      "$py" -m rlgen.cli train "${base[@]}" "${rl[@]}" algo.partial_rollouts=0.25 hydra.run.dir="$out/pad-rl-partial" \
        "$@" > "$out/pad-rl-partial.log" 2>&1
      "$py" -m rlgen.cli train "${base[@]}" "${rl[@]}" algo.partial_rollouts=0.5 algo.partial_max_steps=2 \
        hydra.run.dir="$out/pad-rl-partial-0.5x2" "$@" > "$out/pad-rl-partial-0.5x2.log" 2>&1
      "$py" -m ray.scripts.scripts stop --force > /dev/null 2>&1
      "$py" benchmarks/lengths_report.py "$out/pad-fixed" "$out/pad-rl" "$out/pad-rl-partial" \
        "$out/pad-rl-partial-0.5x2" --out "$out/padding.json" > "$out/padding.log"
    ) &
    (
      export CUDA_VISIBLE_DEVICES=1 RAY_TMPDIR=/tmp/ray-partial-1
      "$py" benchmarks/peer_trl.py "$out/tail-fixed" --sides rlgen_async --new-tokens 256 --steps 10 \
        --hardware 1xh200 "$@" > "$out/tail-fixed.log" 2>&1
      "$py" benchmarks/peer_trl.py "$out/tail-rl" --model "$out/tail-fixed/model" --sides rlgen_async,rlgen_partial,trl \
        --new-tokens 2048 --mean-tokens 256 --steps 10 --hardware 1xh200 "$@" > "$out/tail-rl.log" 2>&1
      for side in tail-fixed/rlgen_async tail-rl/rlgen_async tail-rl/rlgen_partial; do echo "$out/$side/run"; done \
        | xargs "$py" benchmarks/lengths_report.py --out "$out/tail.json" > "$out/tail.log"
    ) &
    wait
    cat "$out/padding.log" "$out/tail.log"
    ;;
  pace)
    # PACE_RUNS: which of the runs below (default all), so the set can be split over calls into one OUT; the
    # report covers every run folder OUT holds
    base=(engine=vllm hardware=1xh200 model=qwen2_5_0_5b algo.prompts_per_step=64 steps=${PACE_STEPS:-10}
          engine.max_model_len=2064 progress=false existing_run=replace)
    rl=(algo.max_new_tokens=2048 task.response_length_mean=256)
    want=" ${PACE_RUNS:-pad-fixed pad-rl-s0-step_start pad-rl-s0 pad-rl-s0-partial pad-rl-s7 pad-rl-s7-partial} "
    one() {  # NAME OVERRIDES...: one run of the pair, where PACE_RUNS names it
      local name=$1; shift
      [[ $want == *" $name "* ]] || return 0
      "$py" -m rlgen.cli train "${base[@]}" hydra.run.dir="$out/$name" "$@" > "$out/$name.log" 2>&1
      echo "$name rc=$?"
    }
    one pad-fixed algo.max_new_tokens=256 "$@"
    one pad-rl-s0-step_start "${rl[@]}" task.seed=0 algo.launch_ahead=step_start "$@"  # the launch before own_in
    partial=(algo.partial_rollouts=0.5 algo.partial_max_steps=2)
    for seed in 0 7; do
      one "pad-rl-s$seed" "${rl[@]}" task.seed=$seed "$@"
      one "pad-rl-s$seed-partial" "${rl[@]}" task.seed=$seed "${partial[@]}" "$@"
    done
    # one engine on the GPU in place of the plan's two (only where PACE_RUNS names them)
    one pad-fixed-1eng algo.max_new_tokens=256 engine.engines_per_gpu=1 "$@"
    one pad-rl-s0-partial-1eng "${rl[@]}" task.seed=0 "${partial[@]}" engine.engines_per_gpu=1 "$@"
    runs=()
    for name in pad-fixed pad-rl-s0-step_start pad-rl-s0 pad-rl-s0-partial pad-rl-s7 pad-rl-s7-partial \
        pad-fixed-1eng pad-rl-s0-partial-1eng; do
      [ -f "$out/$name/metrics.jsonl" ] && runs+=("$out/$name")
    done
    "$py" -m ray.scripts.scripts stop --force > /dev/null 2>&1
    "$py" benchmarks/lengths_report.py "${runs[@]}" --out "$out/pace.json" | tee "$out/pace.log"
    ;;
  precision)
    # bf16 against fp16 in one call: make smoke-gpu's run (its reward curve, mismatch and skips), then the 0.5B
    # padding pair's fixed run (mismatch at 512 sequences a step); lengths_report gives each run's mismatch by
    # length, overflow and non-finite skips
    for p in bf16 fp16; do
      launch=$(date +%s.%N)
      "$py" -m rlgen.cli train engine=vllm hardware=1xh200 model=small steps=150 precision=$p progress=false \
        hydra.run.dir="$out/smoke-$p" "$@" > "$out/smoke-$p.log" 2>&1
      echo "smoke $p rc=$?"
      "$py" benchmarks/learning_curve.py "$out/smoke-$p" --launch "$launch" --out "$out/smoke-$p.json" | tail -3
      "$py" -m rlgen.cli train engine=vllm hardware=1xh200 model=qwen2_5_0_5b algo.prompts_per_step=64 steps=6 \
        algo.max_new_tokens=256 precision=$p progress=false hydra.run.dir="$out/pad-$p" "$@" > "$out/pad-$p.log" 2>&1
      echo "padding $p rc=$?"
      # the smoke shape on-policy: with async_steps=1 the engine samples with the version before the learner's, and
      # that lag, not the numerics, is most of the smoke run's mismatch (k3 0.002 in bf16 and fp16 alike)
      "$py" -m rlgen.cli train engine=vllm hardware=1xh200 model=small steps=150 precision=$p algo.async_steps=0 \
        progress=false hydra.run.dir="$out/smoke-$p-onpolicy" "$@" > "$out/smoke-$p-onpolicy.log" 2>&1
      echo "smoke on-policy $p rc=$?"
    done
    "$py" benchmarks/lengths_report.py "$out"/smoke-bf16 "$out"/smoke-fp16 "$out"/smoke-bf16-onpolicy \
      "$out"/smoke-fp16-onpolicy "$out"/pad-bf16 "$out"/pad-fp16 --out "$out/precision.json" | tee "$out/precision.log"
    ;;
  invariance)
    # deterministic=true: the GPU test (64 prompts alone and inside 512; INV_TEST=0 leaves it out), then for each
    # shape INV_SHAPES names (default "small pad": make smoke-gpu's model=small, which learns, and the 0.5B padding
    # pair's fixed run) two runs with one seed, compared number by number (benchmarks/same_run.py: metrics and the
    # batches' digests), and one without the mode (its cost in tokens/s), side by side in lengths_report
    if [ "${INV_TEST:-1}" = 1 ]; then
      "$py" -m pytest -q tests/gpu/test_batch_invariance.py 2>&1 | tail -5 | tee "$out/invariance-test.log"
    fi
    runs=()
    for shape in ${INV_SHAPES:-small pad}; do
      case "$shape" in
        small) base=(engine=vllm hardware=1xh200 model=small steps=${INV_STEPS:-10} progress=false) ;;
        pad) base=(engine=vllm hardware=1xh200 model=qwen2_5_0_5b algo.prompts_per_step=${INV_PROMPTS:-64} steps=${INV_STEPS:-10}
                   algo.max_new_tokens=256 progress=false) ;;
        *) echo "INV_SHAPES: unknown shape $shape (small, pad)"; exit 2 ;;
      esac
      for name in "$shape-det-a" "$shape-det-b"; do
        "$py" -m rlgen.cli train "${base[@]}" deterministic=true hydra.run.dir="$out/$name" "$@" > "$out/$name.log" 2>&1
        echo "$name rc=$?"
      done
      "$py" benchmarks/same_run.py "$out/$shape-det-a" "$out/$shape-det-b" --out "$out/$shape-same.json" \
        | tee "$out/$shape-same.log"
      "$py" -m rlgen.cli train "${base[@]}" hydra.run.dir="$out/$shape-default" "$@" > "$out/$shape-default.log" 2>&1
      echo "$shape-default rc=$?"
      runs+=("$out/$shape-det-a" "$out/$shape-det-b" "$out/$shape-default")
    done
    "$py" -m ray.scripts.scripts stop --force > /dev/null 2>&1
    "$py" benchmarks/lengths_report.py "${runs[@]}" --out "$out/invariance.json" | tee "$out/invariance.log"
    ;;
  distill)
    # on-policy distillation against RL alone: model=small trained by RL for $TEACHER_STEPS (300) steps is the
    # teacher, then 150 steps of algo=distill from the same start; RL alone is the teacher's own run (same preset,
    # start and seed); benchmarks/distill_report.py: when each reaches the teacher's reward, the teacher's scoring
    base=(engine=vllm hardware=1xh200 model=small progress=false)
    "$py" -m rlgen.cli train "${base[@]}" steps="${TEACHER_STEPS:-300}" hydra.run.dir="$out/teacher" "$@" \
      > "$out/teacher.log" 2>&1
    echo "teacher rc=$?"
    runs=()
    for estimator in ${DISTILL_ESTIMATORS:-sampled full}; do
      "$py" -m rlgen.cli train "${base[@]}" steps=150 algo=distill algo.teacher="$out/teacher/final_model" \
        algo.distill_estimator=$estimator hydra.run.dir="$out/distill-$estimator" "$@" > "$out/distill-$estimator.log" 2>&1
      echo "distill $estimator rc=$?"
      runs+=("$out/distill-$estimator")
    done
    "$py" benchmarks/distill_report.py "$out/teacher" "${runs[@]}" --out "$out/distill.json" \
      --png "$out/distill.png" | tee "$out/distill-report.log"
    ;;
  peer-shapes)
    model=()
    for shape in ${SHAPES:-8:2048:256 4:4096:512}; do
      IFS=: read -r prompts cap mean <<< "$shape"
      "$py" benchmarks/peer_trl.py "$out/peer-$prompts-$cap" "${model[@]}" --prompts "$prompts" --new-tokens "$cap" \
        --mean-tokens "$mean" --sides "${PEER_SIDES:-rlgen_async,rlgen_partial,trl}" --steps 10 --hardware 1xh200 "$@" \
        > "$out/peer-$prompts-$cap.log" 2>&1
      echo "shape $shape rc=$?"; tail -8 "$out/peer-$prompts-$cap.log"
      [ -d "$out/peer-$prompts-$cap/model" ] && model=(--model "$out/peer-$prompts-$cap/model")
    done
    ;;
  long)
    "$py" -m rlgen.cli train engine=vllm hardware=1xh200 model=qwen2_5_1_5b algo.max_new_tokens=32704 \
      task.max_prompt_tokens=64 algo.prompts_per_step=2 algo.samples_per_prompt=4 steps=3 checkpoint.every=0 \
      engine.keep_warm_s=0 progress=false hydra.run.dir="$out/long" "$@" > "$out/long.log" 2>&1
    "$py" benchmarks/lengths_report.py "$out/long" --out "$out/long.json" | tee -a "$out/long.log"
    ;;
  long-7b)
    "$py" -m rlgen.cli train engine=vllm hardware=2xh200 model=qwen2_5_7b algo.max_new_tokens=16384 \
      task.max_prompt_tokens=64 algo.prompts_per_step=2 algo.samples_per_prompt=4 steps=3 checkpoint.every=0 \
      engine.keep_warm_s=0 progress=false hydra.run.dir="$out/long-7b" "$@" > "$out/long-7b.log" 2>&1
    "$py" benchmarks/lengths_report.py "$out/long-7b" --out "$out/long-7b.json" | tee -a "$out/long-7b.log"
    ;;
  learner-long)
    lrn=(--variants t65536:ckpt --lengths fixed --prompt 64 --warmup 1 --steps 2)
    "$py" benchmarks/learner_speed.py --model qwen2_5_0_5b "${lrn[@]}" --rows 1 --resp 65472 \
      --out "$out/learner-0_5b-1x65536.json" 2>&1 | tee "$out/learner-long.log"
    "$py" benchmarks/learner_speed.py --model qwen2_5_0_5b "${lrn[@]}" --rows 16 --resp 4032 \
      --out "$out/learner-0_5b-16x4096.json" 2>&1 | tee -a "$out/learner-long.log"
    # the 1.5B at 131,072 as the plan holds it, then with the MLP tiled and the checkpoints offloaded, each in a
    # process of its own (a DeepSpeed engine does not give all its memory back: a second variant in the same
    # process measured 56.3 GiB where alone it takes 36.2)
    for variant in t131072:ckpt t131072:ckpt:tiled:offload; do
      "$py" benchmarks/learner_speed.py --model qwen2_5_1_5b --variants "$variant" \
        --lengths fixed --prompt 64 --warmup 1 --steps 2 --rows 1 --resp 131008 \
        --out "$out/learner-1_5b-1x131072-${variant//:/-}.json" 2>&1 | tee -a "$out/learner-long.log"
    done
    ;;
  long-131k|long-7b-65k)
    if [ "$stage" = long-131k ]; then
      model=qwen2_5_1_5b prompt=122880 resp=8192
    else
      model=qwen2_5_7b prompt=61440 resp=4096
    fi
    "$py" benchmarks/long_prompts.py "$out/long.jsonl" --rows 4 --tokens "$prompt" | tee "$out/$stage.log"
    "$py" -m rlgen.cli train engine=vllm hardware=1xh200 model=$model task=jsonl task.path="$out/long.jsonl" \
      task.long_prompts=truncate task.max_prompt_tokens=$prompt algo.max_new_tokens=$resp algo.prompts_per_step=1 \
      algo.samples_per_prompt=2 steps=3 checkpoint.every=0 engine.keep_warm_s=0 progress=false \
      hydra.run.dir="$out/$stage" "$@" >> "$out/$stage.log" 2>&1
    echo "train rc=$?" | tee -a "$out/$stage.log"
    "$py" benchmarks/lengths_report.py "$out/$stage" --out "$out/$stage.json" | tee -a "$out/$stage.log"
    ;;
  mismatch-length)
    for length in ${LENGTHS:-1024 16384 65536 131072}; do
      "$py" -m rlgen.cli validate engine=vllm hardware=1xh200 model=${MODEL:-qwen2_5_1_5b} validate.length=$length \
        validate.cases=2 validate.max_requests=1 validate.max_n=1 validate.max_new_tokens=16 \
        hydra.run.dir="$out/validate-$length" "$@" > "$out/validate-$length.log" 2>&1
      echo "length $length rc=$?"; tail -12 "$out/validate-$length.log"
    done
    ;;
  learner-speed)
    # one process per GPU at once, each its own variants; then the four ranks as one ZeRO-2 group
    sets=("mb8:ckpt" "mb32:ckpt,mb64:ckpt" "mb8:nockpt,mb16:nockpt" "mb32:nockpt,mb32:ckpt")
    for g in 0 1 2 3; do
      CUDA_VISIBLE_DEVICES=$g "$py" benchmarks/learner_speed.py --variants "${sets[$g]}" --master-port $((29600 + g)) \
        --out "$out/learner-gpu$g.json" "$@" > "$out/learner-gpu$g.log" 2>&1 &
    done
    wait
    for v in mb8:ckpt mb32:ckpt; do
      for r in 0 1 2 3; do
        CUDA_VISIBLE_DEVICES=$r "$py" benchmarks/learner_speed.py --variants "$v" --world-size 4 --rank $r \
          --master-port 29650 --out "$out/learner-4ranks-${v/:/-}-rank$r.json" "$@" > /dev/null 2>&1 &
      done
      wait
    done
    ;;
  scaling)
    # the 1.5B as typed, the layout the plan's: one GPU (GPU 0) and two (GPUs 1-2) side by side, then four
    one() { name=$1; gpus=$2; shift 2
      CUDA_VISIBLE_DEVICES=$gpus RAY_TMPDIR=/tmp/ray_$name "$py" -m rlgen.cli train engine=vllm model=qwen2_5_1_5b \
        checkpoint.every=0 engine.keep_warm_s=0 progress=false hydra.run.dir="$out/$name" "$@" > "$out/$name.log" 2>&1; }
    one gpus1 0 hardware=1xh100 steps=6 "$@" &
    one gpus2 1,2 hardware=2xh100 steps=6 "$@" &
    wait
    one gpus4 0,1,2,3 hardware=4xh100 steps=6 "$@"
    ;;
  nccl-split)
    CUDA_VISIBLE_DEVICES=0,1,2 "$py" -m rlgen.cli train engine=vllm model=qwen2_5_1_5b hardware=2xh100 \
      hardware.gpus_per_node=3 hardware.colocated=false hardware.engine_gpus=2 algo.prompts_per_step=16 steps=6 \
      checkpoint.every=0 engine.keep_warm_s=0 progress=false hydra.run.dir="$out/nccl-split" "$@" 2>&1 \
      | tee "$out/nccl-split.log"
    ;;
  tp2-split)
    "$py" -m rlgen.cli train engine=vllm_tp2 hardware=4xh100 model=qwen2_5_1_5b engine.num_engines=1 \
      hardware.colocated=false steps=8 checkpoint.every=0 engine.keep_warm_s=0 progress=false \
      hydra.run.dir="$out/tp2-split" "$@" 2>&1 | tee "$out/tp2-split.log"
    ;;
  headline)
    "$py" -m rlgen.cli train engine=vllm_tp2 hardware=4xh100 model=qwen2_5_1_5b steps=20 engine.keep_warm_s=0 \
      progress=false hydra.run.dir="$out/headline" "$@" 2>&1 | tee "$out/headline.log"
    ;;
  headline-sweep)
    "$py" -m rlgen.cli train -m engine=vllm_tp2 hardware=4xh100 model=qwen2_5_1_5b engine.num_engines=1,2 \
      engine.tensor_parallel_size=1,2 steps=20 engine.keep_warm_s=0 progress=false hydra.sweep.dir="$out/sweep" "$@" \
      2>&1 | tee "$out/headline-sweep.log"
    ;;
  *)
    echo "unknown stage $stage (check | test | bench | tune | smoke | core-kill | ckpt-cost | startup | lora | lora-7b | lora-validate | trl-serve | nccl-env | serve-lora | layouts | learner-speed | scaling | nccl-split | tp2-split | headline | headline-sweep)" >&2
    exit 2
    ;;
esac
