# recurlen: `make help` lists the targets.
SHELL := /bin/bash
PY ?= .venv/bin/python
VENV_PY := .venv/bin/python
# CPU wheel pinned here (pyproject keeps a range) so a CPU machine never pulls a multi-GB CUDA build.
TORCH_CPU ?= torch==2.13.0
EXTRAS ?= dev

MODEL ?= tiny
INTERVENTION ?= tbptt
EXPERIMENT ?= finetune
DATA ?=
STEPS ?=
GPUS ?=
NODES ?=
ARGS ?=

.DEFAULT_GOAL := help

help: ## list the targets and what they do
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  \033[36m%-14s\033[0m %s\n", $$1, $$2}' $(MAKEFILE_LIST)

.venv/bin/python:
	python3 -m venv .venv
	$(VENV_PY) -m pip install -q --upgrade pip

install: .venv/bin/python ## create .venv with CPU torch and recurlen[dev] (GPU: EXTRAS=dev,cuda TORCH_CPU=torch)
	$(VENV_PY) -m pip install -q "$(TORCH_CPU)"
	$(VENV_PY) -m pip install -q -e ".[$(EXTRAS)]"

test: ## run the default (CPU) test suite
	$(PY) -m pytest -q

test-slow: ## run the slow tests too
	$(PY) -m pytest -q -m "slow or not slow"

test-gpu: ## run the GPU kernel tests (needs CUDA + recurlen[cuda])
	$(PY) -m pytest -q -m gpu tests/test_gpu_kernels.py

lint: ## ruff over the whole project
	$(PY) -m ruff check recurlen callbacks tests benchmarks

demo-generate: ## tiny forward/generation demo on an untrained model (smoke check)
	$(PY) -m recurlen.cli generate --model $(MODEL) --prompt "def main(" --max-new-tokens 32

.PHONY: help install test test-slow test-gpu lint demo-generate
