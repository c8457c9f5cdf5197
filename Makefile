# Two commands set everything up from nothing:
#   make quickstart   - creates .venv, installs, runs the CPU quickstart sweep
#   make test         - creates .venv, installs, runs the test-suite
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin
# Without a GPU, take PyTorch's CPU build (it lies on this disk; plain `torch` pulls CUDA).
TORCH_SPEC ?= $(shell command -v nvidia-smi >/dev/null 2>&1 && echo torch || echo torch==2.13.0)

.PHONY: quickstart trial test test-gpu clean

$(BIN)/dpo-sweep: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q --upgrade pip
	$(BIN)/pip install -q "$(TORCH_SPEC)"
	$(BIN)/pip install -q -e ".[test]"
	@touch $@

quickstart: $(BIN)/dpo-sweep
	$(BIN)/dpo-sweep run search_spaces/quickstart.yaml

trial: $(BIN)/dpo-sweep
	$(BIN)/dpo-sweep trial search_spaces/quickstart.yaml

test: $(BIN)/dpo-sweep
	$(BIN)/python -m pytest -q -m "not gpu" tests

test-gpu: $(BIN)/dpo-sweep
	$(BIN)/python -m pytest -q -m gpu tests/gpu

clean:
	rm -rf $(VENV) reports/quickstart
