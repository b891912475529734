# Installing beside a torch an environment already has (docs/gpu.md, "An environment that already has
# a CUDA torch"): tools/keep_torch.py writes the constraint, tools/wheelhouse.py builds a wheelhouse for
# an offline node. `make check-install` does both installs for real in throwaway venvs (minutes and
# ~250 MB from PyPI, so not part of `make test`); CHECK_INSTALL_DIR=folder keeps them.
.PHONY: check-install

check-install: ## Install beside an existing torch (docs/gpu.md) for real: offline from a wheelhouse and online, newest pip, torch kept (~8 min, PyPI)
	PYTHON=$(PYTHON) bash tools/check_install.sh
