# Set-up, demo run and tests. `make demo` and `make test` are the two commands of the README.
PYTHON ?= python3
VENV ?= .venv
# torch wheel: the CPU build by default; TORCH_SPEC=torch (plus TORCH_INDEX for a CUDA index) on GPUs
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX ?=
BIN := $(VENV)/bin
export PATH := $(abspath $(BIN)):$(PATH)

.PHONY: setup demo test target prompts clean

$(BIN)/.installed: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install -q "$(TORCH_SPEC)" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(BIN)/pip install -q -e ".[dev]"
	touch $@

setup: $(BIN)/.installed

demo: setup
	$(BIN)/dvc repro
	@grep -m1 "^Gate" reports/quality.md
	@$(BIN)/python -c "import json; r = json.load(open('reports/benchmark.json')); \
	t = json.load(open('reports/train.json')); \
	print(f\"acceptance length tau (chain of {r['num_steps']} at T=0): {r['tau_greedy']} \
	(replayed on the eval split in training: {t['best_replayed_tau']})\")"

test: setup
	$(BIN)/python -m pytest -q

# Rebuild the committed demo target and prompt files (not part of `dvc repro`).
target: setup
	$(BIN)/python -m stages.demo.build_target --out data/demo/target

prompts: setup
	$(BIN)/python -m stages.demo.write_prompts --out data/demo/prompts

clean:
	rm -rf data/prompts data/raw data/merged data/vocab data/hidden models reports .dvc/cache
