# Two commands do all the set-up on a fresh machine: `make run` and `make test`.
# Both create .venv, install qviz with its test extras, and install Debian's graphviz when `dot`
# is missing (and Debian's chromium, for the browser tests, when /usr/bin/chromium is missing).
# Every step is skipped when it is already done.
# `QVIZ_SKIP_BROWSER=1 make test` skips the browser tests (tests/widgets/e2e) locally; CI never
# sets it, and without it a missing chromium fails those tests rather than skipping them.
# Debian's qemu-user is installed too (x86 hosts): one lowering test runs onnxruntime on an
# emulated AVX2-only CPU; `QVIZ_SKIP_EMULATION=1` skips it locally, CI never sets it.

PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.qviz-installed
export PIP_DISABLE_PIP_VERSION_CHECK := 1

# `make test-newest` runs the same suite against the newest torch/torchvision/torchao that
# pyproject.toml allows, in .venv-newest, ignoring a machine-wide pip constraint file that caps
# torch at the release cached on disk: CI runs both, so both ends of the allowed range are tested.
NEWEST       := .venv-newest
NEWEST_STAMP := $(NEWEST)/.qviz-installed

# The suite runs on TEST_WORKERS processes (pytest-xdist; a test file stays on one worker, so a
# module's fixtures are built once), each with one torch thread: on CI's 2 cores this halves
# the Python-bound part of the run. Files go out in collection order (`--no-loadscope-reorder`;
# xdist would otherwise send the files with the most tests first), so tests/conftest.py's
# LONGEST_FIRST starts the longest file at once. `make test TEST_WORKERS=0` runs it in this one
# process.
TEST_WORKERS ?= 2
PYTEST_ARGS  := $(if $(filter 0,$(TEST_WORKERS)),,-n $(TEST_WORKERS) --dist loadfile --no-loadscope-reorder)

.PHONY: run test test-newest lint docs bench system-deps clean

$(STAMP): pyproject.toml
	@test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e ".[test,docs]"
	$(BIN)/python -m pip install --quiet --no-deps aimet-torch==2.42 && $(BIN)/python -m pip install --quiet "bokeh>=3.3.0,<=3.6.3"
	@touch $(STAMP)

$(NEWEST_STAMP): pyproject.toml
	@test -x $(NEWEST)/bin/python || $(PYTHON) -m venv $(NEWEST)
	$(NEWEST)/bin/python -m pip install --quiet --upgrade pip
	PIP_CONSTRAINT=/dev/null $(NEWEST)/bin/python -m pip install --quiet --upgrade -e ".[test,docs]"
	PIP_CONSTRAINT=/dev/null $(NEWEST)/bin/python -m pip install --quiet --no-deps aimet-torch==2.42 && PIP_CONSTRAINT=/dev/null $(NEWEST)/bin/python -m pip install --quiet "bokeh>=3.3.0,<=3.6.3"
	@touch $(NEWEST_STAMP)

system-deps:
	@if ! command -v dot >/dev/null 2>&1; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing Debian's graphviz (the dot binary)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq graphviz >/dev/null; \
	  else \
	    echo "qviz needs Graphviz's 'dot' binary: install it with 'sudo apt-get install graphviz'" \
	         "(Debian/Ubuntu), 'conda install -c conda-forge graphviz' or 'brew install graphviz'," \
	         "then run make again." >&2; \
	    exit 1; \
	  fi; \
	fi
	@if [ ! -x /usr/bin/chromium ] && [ "$${QVIZ_SKIP_BROWSER:-}" != 1 ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing Debian's chromium (for the browser tests)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium >/dev/null; \
	  else \
	    echo "the browser tests need Chromium at /usr/bin/chromium: install it with" \
	         "'sudo apt-get install chromium' (Debian/Ubuntu), or skip them with" \
	         "QVIZ_SKIP_BROWSER=1 make test." >&2; \
	  fi; \
	fi
	@if ! command -v qemu-x86_64 >/dev/null 2>&1 && [ "$$(uname -m)" = x86_64 ] && [ "$${QVIZ_SKIP_EMULATION:-}" != 1 ]; then \
	  if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
	    echo "installing Debian's qemu-user (the lowering tests run onnxruntime on an emulated AVX2 CPU)"; \
	    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq qemu-user >/dev/null; \
	  else \
	    echo "the emulated-CPU lowering test needs qemu-x86_64: install it with" \
	         "'sudo apt-get install qemu-user' (Debian/Ubuntu), or skip it with" \
	         "QVIZ_SKIP_EMULATION=1 make test." >&2; \
	  fi; \
	fi

run: $(STAMP) system-deps
	$(BIN)/qviz

lint: $(STAMP)
	$(BIN)/ruff check qviz tests benchmarks notebooks
	$(BIN)/ruff format --check qviz tests benchmarks

test: $(STAMP) system-deps lint
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} $(BIN)/python -m pytest $(PYTEST_ARGS)
	$(MAKE) --no-print-directory docs

test-newest: $(NEWEST_STAMP) system-deps
	$(NEWEST)/bin/python -c "import torch, torchvision, torchao; print('torch', torch.__version__, 'torchvision', torchvision.__version__, 'torchao', torchao.__version__)"
	OMP_NUM_THREADS=$${OMP_NUM_THREADS:-1} $(NEWEST)/bin/python -m pytest $(PYTEST_ARGS)

# The documentation site (docs/, Sphinx + MyST) into docs/_build/html, offline, every warning an
# error. The notebooks are rendered from executed copies in docs/_build/executed/: the notebook
# tests leave them there, so after pytest in `make test` nothing runs twice; a copy that is
# missing or older than its notebook is executed here first (nbclient, one kernel per notebook).
DOCS_BUILD := docs/_build
docs: $(STAMP) system-deps
	OMP_NUM_THREADS=1 $(BIN)/python docs/execute_notebooks.py
	$(BIN)/python -m sphinx -b html -W --keep-going -q -d $(DOCS_BUILD)/doctrees docs $(DOCS_BUILD)/html
	@echo "docs: $(DOCS_BUILD)/html/index.html"

bench: $(STAMP)
	$(BIN)/python benchmarks/calibrators.py

clean:
	rm -rf $(VENV) $(NEWEST) .pytest_cache .ruff_cache .hypothesis $(DOCS_BUILD) docs/notebooks/*.ipynb
