# Set-up, demo run, checks and tests. `make demo` and `make test` are the two commands of the README.
PYTHON ?= python3
VENV ?= .venv
# torch wheel: the CPU build by default; TORCH_SPEC=torch (plus TORCH_INDEX for a CUDA index) on GPUs
TORCH_SPEC ?= torch==2.13.0
TORCH_INDEX ?=
BIN := $(VENV)/bin
export PATH := $(abspath $(BIN)):$(PATH)

.PHONY: setup demo check test test-fast kill-sweep lock target prompts clean sglang-releases params-doc

# One stamp per torch build asked for (TORCH_SPEC and TORCH_INDEX): asking for another one, in
# an environment that has a torch already, replaces it (pip would keep it as satisfied).
TORCH_STAMP := $(BIN)/.torch-$(shell printf '%s %s' '$(TORCH_SPEC)' '$(TORCH_INDEX)' | cksum | cut -d' ' -f1)

$(BIN)/python:
	@echo "[setup] a virtual environment in $(VENV)"
	$(PYTHON) -m venv $(VENV)

$(TORCH_STAMP): | $(BIN)/python
	@echo "[setup] $(TORCH_SPEC)$(if $(TORCH_INDEX), from $(TORCH_INDEX))"
	rm -f $(BIN)/.torch-*
	$(BIN)/pip uninstall -y torch
	$(BIN)/pip install --progress-bar off "$(TORCH_SPEC)" $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	touch $@

# Every other package at the version in constraints.txt (the versions CI ran with), after torch.
# pip shows each package as it comes (the first set-up takes minutes).
$(BIN)/.installed: pyproject.toml constraints.txt | $(TORCH_STAMP)
	@echo "[setup] the project and its dependencies at the versions in constraints.txt"
	$(BIN)/pip install --progress-bar off -c constraints.txt -e ".[dev]"
	@echo "[setup] done"
	touch $@

setup: $(BIN)/.installed $(TORCH_STAMP)

demo: setup
	$(BIN)/dvc repro
	@grep -m1 "^Gate" reports/quality.md
	@$(BIN)/python -c "import json; r = json.load(open('reports/benchmark.json')); \
	t = json.load(open('reports/train.json')); \
	print(f\"acceptance length tau (chain of {r['num_steps']} at T=0): {r['tau_greedy']} \
	(replayed on the eval split in training: {t['best_replayed_tau']})\")"
	@echo "report: $(abspath reports/index.html)  (model card: models/card/README.md)"

# Lint, format, types of the library, the structure (dvc.yaml deps = imports; layering), and the
# paths, modules, options, tests and make targets the prose names.
check: setup
	$(BIN)/ruff check stages tests tools demo
	$(BIN)/ruff format --check stages tests tools demo
	$(BIN)/mypy
	$(BIN)/python tools/structure.py
	$(BIN)/python tools/prose_paths.py

# The supported SGLang releases' own source, read by the contract tests (tests/sglang_contract):
# each wheel from the registry, without dependencies, unpacked under .sglang-releases/<version>/.
sglang-releases: setup
	$(BIN)/python tools/sglang_releases.py

# Two pytest-xdist processes: the suite's processes wait on I/O and on each other often enough
# that two share two cores well (docs/performance.md has the times).
test: setup sglang-releases
	$(BIN)/python -m pytest -q -n 2

# The quick loop: every test but the slow ones (over half a second each: training runs, whole
# pipelines, kill -9, torchrun, servers), in two processes (pytest-xdist), timed;
# docs/performance.md has the measured figure.
test-fast: setup sglang-releases
	@start=$$(date +%s); $(BIN)/python -m pytest -q -m "not slow" -n 2 && \
	echo "test-fast: $$(( $$(date +%s) - start )) s wall"

# kill -9 at 21 seeded points per stage over the whole run of generate, extract, train and
# train_dflash, each rerun and compared with an uninterrupted run (tests/runtime/test_kill_sweep.py;
# `make test` runs 3): prints where the kills landed and what the reruns lost, duplicated or got
# wrong. Under an hour.
kill-sweep: setup
	KILL_SWEEP_POINTS=21 $(BIN)/python -m pytest -q tests/runtime/test_kill_sweep.py

lock: setup
	{ sed -n 1,2p constraints.txt; $(BIN)/pip freeze --exclude-editable \
	  | grep -v "^torch==\|^nvidia-\|^triton==\|^eagle-pipeline"; } > constraints.txt.new
	mv constraints.txt.new constraints.txt

# docs/params.md from the typed params in stages/params/ (tests/stages/test_params_doc.py fails
# when it is stale).
params-doc: setup
	$(BIN)/python tools/params_doc.py

# Rebuild the committed demo target and prompt files (not part of `dvc repro`).
target: setup
	$(BIN)/python -m demo.build_target --out data/demo/target

prompts: setup
	$(BIN)/python -m demo.write_prompts --out data/demo/prompts

clean:
	rm -rf data/prompts data/raw data/merged data/vocab data/hidden models reports .dvc/cache
