# cerebellar-norse: set up, run and test.
#   make run    create .venv if missing, then serve on the built-in default config
#   make test   create .venv if missing, then lint, type-check and run the tests
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
STAMP := $(VENV)/.installed

.PHONY: venv run test lint typecheck pytest bench crossval clean tools

venv: $(STAMP)

# torch first (pinned: on CPU hosts the local CPU wheel), then the resolvable
# runtime and dev requirements, then norse/nir/nirtorch and this package with
# --no-deps so norse's torchvision requirement never pulls a CUDA torch.
$(STAMP): pyproject.toml requirements/runtime.txt requirements/norse.txt requirements/dev.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet --upgrade pip
	$(PIP) install --quiet torch==2.13.0
	$(PIP) install --quiet -r requirements/runtime.txt -r requirements/dev.txt
	$(PIP) install --quiet --no-deps -r requirements/norse.txt
	$(PIP) install --quiet --no-deps -e .
	$(PY) -c "import torch, norse, numba, fastapi; print('environment ready: torch', torch.__version__)"
	touch $(STAMP)

run: venv
	$(VENV)/bin/cerebellar-norse

# promtool, haproxy and systemd-analyze are used by the tests when present; `make tools`
# installs promtool and haproxy from Debian where apt-get is available (CI runs it).
tools:
	@command -v promtool >/dev/null 2>&1 || { command -v apt-get >/dev/null 2>&1 && \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq prometheus >/dev/null) || \
	  echo "promtool unavailable: its tests will be skipped"; }
	@command -v haproxy >/dev/null 2>&1 || { command -v apt-get >/dev/null 2>&1 && \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq haproxy >/dev/null) || \
	  echo "haproxy unavailable: the scale-out tests will be skipped"; }
	@command -v logrotate >/dev/null 2>&1 || { command -v apt-get >/dev/null 2>&1 && \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq logrotate >/dev/null) || \
	  echo "logrotate unavailable: the log rotation tests will be skipped"; }
	@command -v wrk >/dev/null 2>&1 || { command -v apt-get >/dev/null 2>&1 && \
	  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq wrk >/dev/null) || \
	  echo "wrk unavailable: the wrk benchmark's test will be skipped"; }

lint: venv
	$(VENV)/bin/ruff check cerebellar_norse tests benchmarks scripts

typecheck: venv
	$(VENV)/bin/mypy

pytest: venv
	$(VENV)/bin/pytest -q

test: venv tools lint typecheck pytest

bench: venv
	$(VENV)/bin/cerebellar-norse bench

crossval: venv
	$(VENV)/bin/cerebellar-norse crossval

clean:
	rm -rf $(VENV) .mypy_cache .ruff_cache .pytest_cache
