# recurlen: `make help` lists the targets.
SHELL := /bin/bash
VENV := .venv
PY := $(VENV)/bin/python
# CPU wheel pinned here (pyproject keeps a range) so a CPU machine never pulls a multi-GB CUDA build.
# On a GPU machine: make install EXTRAS=dev,cuda TORCH_CPU=torch
TORCH_CPU ?= torch==2.13.0
EXTRAS ?= dev
STAMP := $(VENV)/.installed
# mamba-ssm's and fla's Triton kernels on CPU (make test-kernels): triton from the kernels-cpu extra, mamba-ssm
# built without its CUDA extensions (Python-only, seconds) and without its GPU-only dependencies, and fla-core.
MAMBA_SSM ?= mamba-ssm==2.3.2.post1
# flash-linear-attention's kernels for GLA: fla-core is its ops package (pure Python, no transformers), pinned to
# the release whose chunked GLA kernel the interpreter tests were verified with.
FLA_CORE ?= fla-core==0.6.0
# fla's own models (layers, models: the fla-format parity tests run fla's LM on recurlen's export), beside fla-core,
# without its dependencies (transformers comes with recurlen[dev]); the release of the fla-core pin.
FLA_MODELS ?= flash-linear-attention==0.6.0
KERNELS_STAMP := $(VENV)/.kernels-cpu
# make bench: every script appends its headline rows here, and benchmarks/table.py prints them as one table.
BENCH_RESULTS := runs/bench/results.jsonl

OFFICIAL := 130m 370m 780m 1.3b 2.7b
MODEL ?= tiny
INTERVENTION ?= tbptt
DATA ?=
STEPS ?=
GPUS ?=
NODES ?=
STRATEGY ?=
RUN ?=
ARCH ?=
RUNS ?=
QUICK ?=
SEEDS ?=
OUT ?= runs/eval
FORMAT ?= official
ARGS ?=

# The demo whose runs the next steps use: one that finished (its report.md written after every stage), the full
# demo's runs/demo first (its base is the better trained: 2000 steps against the quick demo's 600), else the quick
# demo's runs/demo-quick, else none. A demo stopped half-way is not used.
DEMO_ROOTS ?= runs/demo runs/demo-quick
FINISHED_DEMOS := $(foreach d,$(DEMO_ROOTS),$(if $(wildcard $(d)/report.md),$(if \
	$(wildcard $(d)/pretrain/checkpoints/last.ckpt),$(d))))
DEMO_ROOT := $(firstword $(FINISHED_DEMOS))
DEMO_NOTE := $(if $(DEMO_ROOT),the $(DEMO_ROOT) demo's$(if $(word 2,$(FINISHED_DEMOS)), (the full demo's first; \
	$(word 2,$(FINISHED_DEMOS)) is not used)))
# MODEL=tiny post-trains that demo's pre-trained base with the demo's post-training recipe
# (experiments/demo-posttrain.yaml: T = 32, lr 5e-4) into runs/finetune/tiny-<demo>-INTERVENTION (its own run
# directory per base: a run of one base never resumes from another's); before any demo there is no pre-trained
# tiny model, and the run trains one from scratch in runs/finetune/tiny-INTERVENTION (its plan and log say so).
DEMO_BASE := $(if $(DEMO_ROOT),$(DEMO_ROOT)/pretrain/checkpoints/last.ckpt)
TINY_BASE := $(if $(filter tiny,$(MODEL)),$(DEMO_BASE))
# make eval without RUNS=: that demo's base and its none / state_passing / tbptt runs (both demos have them), the
# base labelled "base" as the demo's own report labels it.
DEMO_EVAL_RUNS := $(if $(DEMO_ROOT),base=$(DEMO_ROOT)/pretrain $(addprefix $(DEMO_ROOT)/post/,none state_passing tbptt))
# make finetune VAR=... -> recurlen finetune overrides (only the ones given).
FINETUNE_ARGS := $(if $(TINY_BASE),experiment=demo-posttrain model.pretrained=$(TINY_BASE) \
	$(if $(RUN),,run_dir=runs/finetune/tiny-$(notdir $(DEMO_ROOT))-$(INTERVENTION)),model=$(MODEL)) \
	intervention=$(INTERVENTION) \
	$(if $(DATA),data=$(DATA)) $(if $(STEPS),trainer.max_steps=$(STEPS)) \
	$(if $(GPUS),trainer.accelerator=gpu trainer.devices=$(GPUS)) $(if $(NODES),trainer.num_nodes=$(NODES)) \
	$(if $(or $(GPUS),$(NODES)),trainer.strategy=$(or $(STRATEGY),ddp)) $(if $(RUN),run_dir=$(RUN)) $(ARGS)

.DEFAULT_GOAL := help

help: ## list the targets and what they do
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  \033[36m%-14s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)
	@echo "  variables: QUICK= ARCH= SEEDS= MODEL=$(MODEL) INTERVENTION=$(INTERVENTION) DATA= STEPS= GPUS= NODES= STRATEGY= RUN= ARGS='a.b=c'"

$(STAMP): pyproject.toml
	test -x $(PY) || python3 -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_CPU)"
	$(PY) -m pip install -q -e ".[$(EXTRAS)]"
	touch $(STAMP)

$(KERNELS_STAMP): $(STAMP)
	$(PY) -m pip install -q -e ".[$(EXTRAS),kernels-cpu]"
	MAMBA_SKIP_CUDA_BUILD=TRUE MAMBA_FORCE_BUILD=TRUE $(PY) -m pip install -q --no-build-isolation --no-deps "$(MAMBA_SSM)"
	$(PY) -m pip install -q --no-deps "$(FLA_CORE)" "$(FLA_MODELS)"
	touch $(KERNELS_STAMP)

install: $(STAMP) ## create .venv with CPU torch and recurlen[dev] (GPU: EXTRAS=dev,cuda TORCH_CPU=torch)

demo: $(STAMP) ## the main job: failure past T and its fix on a CPU, report in runs/demo/report.md (QUICK=1: the short form, runs/demo-quick; ARCH=<architecture>: its tiny model's demo; SEEDS=N: N seeds, verdicts counted over them)
	$(PY) -m recurlen demo $(if $(filter-out 0,$(QUICK)),quick=true) $(if $(ARCH),arch=$(ARCH)) $(if $(SEEDS),seeds=$(SEEDS)) $(ARGS)

test: $(STAMP) ## run the default (CPU) test suite, one test file per worker on up to 4 cores (pytest-xdist)
	$(PY) -m pytest -q -n auto --maxprocesses 4 --dist loadfile

test-slow: $(STAMP) ## run the slow tests too
	$(PY) -m pytest -q -m "not kernels and not rehearsal"

test-rehearsal: $(STAMP) ## official 130m shape on CPU: load, bf16 post-training per intervention, resume, 128k eval (~20 min idle, ~50 busy)
	$(PY) -m pytest -q -m rehearsal tests/test_rehearsal_130m.py

test-kernels: $(KERNELS_STAMP) ## backend="kernel" == "torch" with mamba-ssm's and fla's real Triton kernels on CPU (interpreter; every tests/models/<arch>/test_*kernels_cpu.py and tests/models/test_*kernels_cpu.py)
	TRITON_INTERPRET=1 $(PY) -m pytest -q -n auto --maxprocesses 4 --dist loadfile -m kernels $(wildcard tests/models/*/test_*kernels_cpu.py tests/models/test_*kernels_cpu.py)

test-gpu: $(STAMP) ## the GPU tests: kernels == torch backend, FSDP run (needs CUDA + recurlen[cuda])
	$(PY) -m pytest -q -m gpu tests/models/mamba2/test_gpu_kernels.py tests/training/test_gpu_fsdp.py

lint: $(STAMP) ## ruff over the whole project; pylint's repeated-code check over the package (pyproject.toml)
	$(PY) -m ruff check recurlen callbacks tests benchmarks
	$(PY) -m pylint recurlen callbacks

finetune: $(STAMP) ## post-train: MODEL= INTERVENTION= [DATA= STEPS= GPUS= NODES= STRATEGY= RUN= ARGS=] (tiny: the demo's base)
	$(if $(filter tiny,$(MODEL)),@echo "make finetune: $(if $(TINY_BASE),post-training $(DEMO_NOTE) pre-trained \
	base $(TINY_BASE),no finished demo yet (make demo writes runs/demo, make demo QUICK=1 runs/demo-quick): \
	training a tiny model from scratch)")
	$(PY) -m recurlen finetune $(FINETUNE_ARGS)

fit-noise: $(STAMP) ## fit fitted-noise statistics: MODEL= [DATA= ARGS=]
	$(PY) -m recurlen fit-noise model=$(MODEL) intervention=fitted_noise $(if $(DATA),data=$(DATA)) $(ARGS)

eval: $(STAMP) ## evaluate RUNS="dir dir ..." (default: the demo's runs, runs/demo or runs/demo-quick) to OUT= (position-wise, reset control, state norms, EffRem)
	$(if $(RUNS),,$(if $(DEMO_ROOT),@echo "make eval: no RUNS= given: this evaluates $(DEMO_NOTE) runs and not \
	a run you post-trained (make eval RUNS=<its run directory> evaluates that one): $(DEMO_EVAL_RUNS)",\
	@echo "make eval: no demo runs to evaluate (make demo writes runs/demo, make demo QUICK=1 runs/demo-quick); \
	run one, or name runs with RUNS='dir dir ...'" >&2; exit 2))
	$(PY) -m recurlen eval $(or $(RUNS),$(DEMO_EVAL_RUNS)) --out $(OUT) $(ARGS)
	$(PY) -m recurlen report $(OUT) --out $(OUT)

export: $(STAMP) ## export RUN= (a run or .ckpt) as FORMAT=official|transformers + model card to exports/<run>-FORMAT [ARGS=]
	$(PY) -m recurlen export $(RUN) --out exports/$(notdir $(patsubst %/,%,$(RUN)))-$(FORMAT) format=$(FORMAT) $(ARGS)

passkey: $(STAMP) ## passkey retrieval per intervention (experiments/passkey.yaml) [ARGS='intervention=... task.lengths=[...]']
	$(PY) -m recurlen passkey $(ARGS)

arbiter: $(STAMP) ## the loss verdict beside the retrieval verdict on a base that retrieves and is a language model: its post-trainings and the training-free fixes (runs/arbiter/report.md; 17 CPU-minutes) [ARGS=...]
	$(PY) -m recurlen arbiter $(ARGS)

fixes-table: $(STAMP) ## every post-training and training-free fix on each demo base and the arbiter's, one table: loss verdict, retrieval verdict, intervals, cost (run the demos and make arbiter first) [ARGS='--arch gla']
	$(PY) scripts/fixes_table.py $(ARGS)

babilong: $(STAMP) ## BABILong accuracy by context length (experiments/babilong.yaml) [ARGS=...]
	$(PY) -m recurlen babilong $(ARGS)

copying: $(STAMP) ## synthetic copying beyond the training length (experiments/copying.yaml) [ARGS=...]
	$(PY) -m recurlen copying $(ARGS)

niah: $(STAMP) ## needle in a haystack, RULER's family: depth x length heatmaps (experiments/niah.yaml) [ARGS=...]
	$(PY) -m recurlen niah $(ARGS)

tensorboard: $(STAMP) ## TensorBoard over every run under runs/
	$(VENV)/bin/tensorboard --logdir runs

generate: $(STAMP) ## greedy continuation from an untrained MODEL (smoke check) or ARGS='--checkpoint runs/x'
	$(PY) -m recurlen generate $(if $(ARGS),$(ARGS),model=$(MODEL))

# bench needs the kernels' CPU install too: fla-core (with Triton) is the peer of RWKV-6's WKV scan.
bench: $(KERNELS_STAMP) ## run the CPU benchmark scripts (quick settings; not in CI), ending with one table of every ratio
	$(PY) benchmarks/table.py --start $(BENCH_RESULTS)
	for b in $(filter-out benchmarks/bench_gpu%.py,$(wildcard benchmarks/bench_*.py)); do echo "== $$b"; RECURLEN_BENCH_RESULTS=$(BENCH_RESULTS) $(PY) $$b --quick || exit 1; done
	$(PY) benchmarks/table.py $(BENCH_RESULTS)

gpu-check: ## the GPU path in one command (GPU machine, <10 min): installs it, tests, agreement, speed, 130m runs, JSON
	ARGS="$(ARGS)" bash scripts/gpu_check.sh

bench-gpu: $(STAMP) ## GPU check: kernel backend == torch backend, and their training throughput (needs CUDA + [cuda])
	$(PY) benchmarks/bench_gpu.py $(ARGS)
	$(PY) benchmarks/bench_gpu_arch.py

.PHONY: help install demo test test-slow test-rehearsal test-kernels test-gpu gpu-check lint finetune fit-noise eval export passkey arbiter fixes-table babilong copying niah tensorboard generate bench bench-gpu
