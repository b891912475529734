# attnbench: `make help` lists the targets.
PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
# Offline by default for tests: a missing hub dataset otherwise costs 20+ s of retries.
# Bytecode written even where the environment says not to (PYTHONDONTWRITEBYTECODE=1, as on the CI
# machines): the suite starts hundreds of processes, and each would compile every module it imports
# from source again (a third of the suite's CPU in a fresh clone).
TEST_ENV := HF_DATASETS_OFFLINE=1 HF_HUB_OFFLINE=1 WANDB_MODE=offline PYTHONDONTWRITEBYTECODE=
# The project's own modules compiled before the workers and the processes they start import them
# (only the changed files are compiled again; a second or two in a fresh clone).
COMPILE := $(BIN)/python -m compileall -q -j 0 bench_cli tasks models tests tools

.DEFAULT_GOAL := help
.PHONY: help install run test test-durations lint bench clean

help: ## Show this help
	@awk -f mk/help.awk -v width=$$([ -t 1 ] && tput cols 2>/dev/null || echo 80) -v color=$$([ -t 1 ] && echo 1 || echo 0) $(filter-out %.awk,$(MAKEFILE_LIST))

install: $(STAMP) ## Create .venv and install attnbench with every extra (torch 2.13.0 CPU build first)

# Every extra (every family) and the test tools; constraints.txt holds this machine's CPU builds;
# with uv where it installs, else pip (tools/install_venv.sh says why).
$(STAMP): pyproject.toml constraints.txt tools/install_venv.sh
	PYTHON=$(PYTHON) bash tools/install_venv.sh $(VENV) '.[all,bench,test]'
	@touch $(STAMP)

run: install ## Train the default model (UEA JapaneseVowels, softmax, CPU, ~1 min); ARGS="..." adds overrides
	PYTHONDONTWRITEBYTECODE= $(BIN)/attnbench run $(ARGS)

# One pytest-xdist worker per core (TEST_WORKERS=0: one process, for a debugger).
TEST_WORKERS ?= auto
test: install ## Run the test suite (offline, one worker per core)
	@$(COMPILE)
	$(TEST_ENV) $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadgroup --durations=10 $(PYTEST_ARGS)

lint: install ## ruff check with the project's configuration (pyproject.toml); the suite runs it too
	$(BIN)/ruff check .

bench: install ## Time every attention variant against softmax at N=1024 and 4096
	$(BIN)/python -m bench_cli.commands.bench_attention $(ARGS)

# Feature targets (reproduce-*, profile figures...) live in mk/*.mk, one file per feature.
-include mk/*.mk

clean: ## Remove Hydra output folders (keeps results/ and .venv)
	rm -rf outputs multirun

# Where the suite's time goes: CPU seconds per test file and the slowest tests (tests/durations.py).
DURATIONS := .test-durations/run
test-durations: install ## Run the suite and print CPU seconds per test file and the slowest tests (keep make test under 5 min)
	@rm -rf $(dir $(DURATIONS)) && mkdir -p $(dir $(DURATIONS))
	@$(COMPILE)
	@echo "load average before: $$(cut -d' ' -f1-3 /proc/loadavg)"
	-$(TEST_ENV) ATTNBENCH_TEST_DURATIONS=$(abspath $(DURATIONS)) $(BIN)/python -m pytest -q -n $(TEST_WORKERS) --dist loadgroup $(PYTEST_ARGS)
	@echo "load average after: $$(cut -d' ' -f1-3 /proc/loadavg)"
	@$(BIN)/python tests/durations.py $(abspath $(DURATIONS))
