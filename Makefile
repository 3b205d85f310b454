# rlgen developer targets. `make help` lists them.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
RLGEN ?= $(VENV)/bin/rlgen
# CPU torch: pinned so a CPU machine does not pull CUDA packages. The GPU extra brings its own torch.
TORCH_CPU ?= torch==2.13.0
TRL ?= trl==1.16.0

.PHONY: help install train smoke smoke-gpu test test-all layers lint bench clean

help:  ## list targets
	@grep -E '^[a-z-]+:.*## ' $(MAKEFILE_LIST) | awk -F':.*## ' '{printf "  %-10s %s\n", $$1, $$2}'

$(PY):
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip

install: $(PY)  ## create .venv and install rlgen (CPU torch) with dev tools and the data and LoRA extras
	$(PY) -m pip install -q $(TORCH_CPU)
	$(PY) -m pip install -q -e ".[dev,data,lora]"
	# TRL's vLLM client, which the serve tests drive; its module needs none of TRL's own dependencies
	$(PY) -m pip install -q --no-deps $(TRL)

train:  ## the main job: `rlgen train` on the embedded default (CPU, tiny model)
	$(RLGEN) train

# The smoke runs write to fixed folders, each replacing its last run there (existing_run=replace).
smoke:  ## the embedded default run, which learns (about a minute on 2 cores)
	$(RLGEN) train hydra.run.dir=outputs/smoke existing_run=replace

# On one GPU, with the gpu extra: vLLM engine and DeepSpeed learner colocated, the engine generating the next batch
# while the learner trains; a 2.4M-parameter model built and warm-started on the GPU (no download), then RL.
SMOKE_GPU ?= engine=vllm hardware=1xh100 model=small steps=150 hydra.run.dir=outputs/smoke-gpu existing_run=replace
smoke-gpu:  ## a GPU run that learns in a few minutes (one H100; needs the gpu extra)
	$(RLGEN) train $(SMOKE_GPU)

test: layers  ## the layer contract, then the CPU test suite but the runs marked long, each test named as it ends
	$(PY) -m pytest -v -m "not gpu and not long" --durations=25

test-all: layers  ## make test and the runs marked long (learning runs, second end-to-end runs of a feature)
	$(PY) -m pytest -v -m "not gpu" --durations=25

layers:  ## the layer contract in pyproject.toml (import-linter): no import goes up a layer or round a cycle
	$(VENV)/bin/lint-imports --no-cache

lint: layers  ## the layer contract and ruff
	$(VENV)/bin/ruff check src tests benchmarks

bench:  ## generation benchmark (needs a GPU and the gpu extra)
	$(RLGEN) bench engine=vllm hardware=1xh100 model=qwen2_5_1_5b

clean:  ## remove run outputs
	rm -rf outputs multirun .pytest_cache
