# mmgcu: one-command set-up. Every target is idempotent and works on a fresh machine.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# torch comes from the local CPU wheel; an unpinned torch would pull the CUDA build.
TORCH_VERSION := 2.13.0
STAMP := $(VENV)/.mmgcu-installed

.PHONY: install install-t20 install-xla test test-t20 conformance xla-zoo demo demo-t20 bench zoo lint clean-venv

install: $(STAMP)

$(STAMP): setup.py requirements/runtime.txt requirements/optional.txt requirements/tests.txt requirements/build.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet torch==$(TORCH_VERSION)
	# torch 2.13 declares setuptools>=77, but mmcv 2.1.0's build and mmengine 0.10.7's
	# pkg_resources need setuptools<70 (torch runs with it): no resolver complaint about it.
	$(PIP) install --quiet --no-warn-conflicts -r requirements/build.txt
	# mmcv with compiled ops; pip caches the built wheel, so only the first machine-wide build is slow.
	$(PY) -c "import mmcv._ext" 2>/dev/null || \
		MMCV_WITH_OPS=1 FORCE_CUDA=0 $(PIP) install --no-build-isolation mmcv==2.1.0
	$(PIP) install --quiet --no-warn-conflicts -r requirements/runtime.txt -r requirements/optional.txt -r requirements/tests.txt
	$(PIP) install --quiet --no-build-isolation --no-deps -e .
	# yapf (mmengine's Config imports it) writes its grammar cache on the first import after
	# an install and renames the file into place before flushing it: processes that start
	# together then can read it empty ("EOFError: Ran out of input" in load_grammar). One
	# import here writes it before any test or rank starts.
	$(PY) -c "import yapf"
	# Pre-build the simulator's C++ part once, so many ranks starting together find it cached
	# (as a script: 'python -m' would import the mmgcu package, and with it this module, first).
	$(PY) mmgcu/sim/build.py
	touch $(STAMP)

# Both legs: the main environment (torch 2.x: everything), then the T20 stack's own
# (Python 3.8, torch 1.10, simulated torch_gcu 1.x): the unit and simulator tests and the
# end-to-end tests marked t20. Tests that need torch 2.x skip there, each with its reason.
T20_TESTS := tests --ignore=tests/cli --ignore=tests/tools --ignore=tests/configs \
	--ignore=tests/conformance -m "t20 or not e2e"
# pytest-xdist workers per leg: most tests start processes that wait (on a collective, a
# timeout, each other), so more workers than cores keep the cores busy. Tests that share a
# multi-process run (a module- or session-scoped fixture) are one xdist_group, so the run
# is made once, not once per worker.
TEST_WORKERS ?= 3
XDIST := -n $(TEST_WORKERS) --dist loadgroup
test: install install-t20 lint
	$(PY) -m pytest $(XDIST) --ignore=tests/conformance
	$(T20_PY) -m pytest $(XDIST) $(T20_TESTS)

# Only the T20 stack's leg.
test-t20: install-t20
	$(T20_PY) -m pytest $(XDIST) $(T20_TESTS)

# The main job on 8 simulated T20 cards (MMGCU_SIMULATE=t20: torch_gcu 1.x, the T20's
# generation): stock mmseg tools/train.py through tools/dist_train.sh
# (mmgcu train), 40 iterations that learn; then the loss and mIoU curves and a few
# predictions as PNG files, and what was learnt next to the background-only baseline.
DEMO_CONFIG := configs/tiny/fcn_r18-tiny-d8_8xgcu-40it_synthetic-64x64.py

# $(call run_demo,PYTHON,WORK_DIR,SIMULATOR_ENV,WHAT): train, plot, say where things are.
define run_demo
	$(1) tools/make_synthetic_dataset.py data/synthetic
	rm -rf $(2) && mkdir -p $(2)
	@set -o pipefail; start=$$(date +%s); \
	$(3) PYTHON=$(1) tools/dist_train.sh $(DEMO_CONFIG) --work-dir $(2) 2>&1 \
		| tee $(2)/demo.log && \
	echo "---------------------------------------------------------------------------" && \
	echo "$(4), $(DEMO_CONFIG): $$(( $$(date +%s) - start )) s" && \
	$(1) tools/plot_demo.py $(2) && \
	echo "log:         $(2)/demo.log"
endef

demo: install
	$(call run_demo,$(PY),work_dirs/demo,MMGCU_SIMULATE=t20,8 simulated T20 cards (torch_gcu 1.x API))
	@echo "Rehearse your own config the same way:" && \
	echo "  source .venv/bin/activate && MMGCU_SIMULATE=t20 mmgcu train CONFIG"

# The same demo on the T20's own stack (.venv-t20: Python 3.8, torch 1.10) and its
# torch_gcu 1.x API (XLA devices xla:N, ECCL in torch_gcu.distributed), simulated.
demo-t20: install-t20
	$(call run_demo,$(T20_PY),work_dirs/demo-t20,MMGCU_SIMULATE=t20,8 simulated T20 cards (torch_gcu 1.x on torch 1.10))

# What mmgcu costs: per-iteration overhead, start-up, the 8-card rehearsal (both torch_gcu
# APIs, --amp, gcu1 against a baseline commit), the simulator's cost per op, card reads per
# iteration, one SyncBN layer, the lazy graph's cost, padded validation. Then the run is kept
# in tools/benchmarks/runs/ and docs/performance.md is written from the kept runs.
# BENCH_ARGS=--quick for a smoke run (not kept), --check to fail when a target is missed,
# "--sections graphs,padding" for some sections (the others keep their last run).
BENCH_ARGS ?=
bench: install
	$(PY) tools/benchmarks/bench.py --out bench_results/bench.json $(BENCH_ARGS)
	$(PY) tools/benchmarks/performance.py --add bench_results/bench.json

# mmseg's model zoo, one stock config per family, rehearsed (mmgcu rehearse) on 2 simulated
# cards of each leg: S60 cards (torch_gcu 2.x) on torch 2.13, T20 cards (torch_gcu 1.x) on
# the T20 stack; then the table of both in docs/zoo.md. About an hour on 2 cores.
zoo: install install-t20
	# mmdet (Mask2Former, MaskFormer) only here: mmseg imports it in every process once installed.
	$(PIP) install --quiet --no-warn-conflicts -r requirements/zoo.txt
	tools/install_t20.sh $(T20_PY) --mmdet
	$(PY) tools/zoo.py run --leg main --out zoo_results/main.json
	$(T20_PY) tools/zoo.py run --leg t20 --out zoo_results/t20.json
	$(PY) tools/zoo.py plain --out zoo_results/main.json --other zoo_results/t20.json
	$(T20_PY) tools/zoo.py plain --out zoo_results/t20.json --other zoo_results/main.json
	$(PY) tools/zoo.py table zoo_results/main.json zoo_results/t20.json --out docs/zoo.md

# ruff, and the T20 stack's Python: everything outside the v2 backend must parse on 3.8.
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/vermin -t=3.8- --violations --no-tips --eval-annotations mmgcu tools setup.py

# The simulated T20 card against a real XLA runtime (tests/conformance): the programs run
# once on torch_xla 2.9 on the CPU (.venv-xla), then on a simulated card of each leg, which
# must run and compile the same graphs. CI runs it after make test.
XLA_VENV := .venv-xla
XLA_PY := $(XLA_VENV)/bin/python
XLA_STAMP := $(XLA_VENV)/.mmgcu-installed
ORACLE := work_dirs/conformance/oracle.jsonl
conformance: install install-t20 install-xla
	mkdir -p $(dir $(ORACLE))
	PJRT_DEVICE=CPU $(XLA_PY) -m tests.conformance.run xla > $(ORACLE)
	MMGCU_CONFORMANCE=required MMGCU_ORACLE_RESULTS=$(ORACLE) $(PY) -m pytest -q tests/conformance
	MMGCU_CONFORMANCE=required MMGCU_ORACLE_RESULTS=$(ORACLE) $(T20_PY) -m pytest -q tests/conformance

# Five of the zoo's stock configs on torch_xla and on the simulated card (torch_xla's
# lowerings and the T20's), with and without mmgcu keeping their graph whole: the table in
# docs/xla_zoo.md. About an hour on 2 cores (torch_xla compiles on the CPU); a rerun runs only
# the cells that zoo_results/xla_zoo.json lacks or that failed.
xla-zoo: install install-t20 install-xla
	$(PY) -m tests.conformance.xla_zoo table --out docs/xla_zoo.md

install-xla: $(XLA_STAMP)

# mmcv's wheel is built against torch 2.9 into a pip cache of its own: pip keys its cache by
# Python version, and .venv's wheel (built against torch 2.13) fails to load here.
$(XLA_STAMP): requirements/xla.txt requirements/build.txt requirements/runtime.txt requirements/optional.txt
	test -x $(XLA_PY) || $(PYTHON) -m venv $(XLA_VENV)
	$(XLA_PY) -m pip install --quiet -r requirements/xla.txt
	$(XLA_PY) -m pip install --quiet --no-warn-conflicts -r requirements/build.txt
	$(XLA_PY) -c "import mmcv._ext" 2>/dev/null || PIP_CACHE_DIR=$(HOME)/.cache/pip-torch29 \
		MMCV_WITH_OPS=1 FORCE_CUDA=0 $(XLA_PY) -m pip install --no-build-isolation mmcv==2.1.0
	$(XLA_PY) -m pip install --quiet --no-warn-conflicts -r requirements/runtime.txt -r requirements/optional.txt
	$(XLA_PY) -c "import yapf"
	touch $(XLA_STAMP)

# The T20's own stack (Python 3.8, torch 1.10 under torch_gcu 1.x) in .venv-t20: the vendor's
# stack is stood in for by requirements/t20-vendor.txt, then mmgcu goes in as a T20 user
# installs it into the vendor's environment (tools/install_t20.sh, which keeps its torch).
# PYTHON38=/path/to/python3.8 picks the interpreter; by default the python3.8 on PATH (the
# interpreter itself, not a pyenv shim), else the newest 3.8 in pyenv's folder (PYENV_ROOT,
# else ~/.pyenv).
PYTHON38 ?= $(shell python3.8 -c 'import sys; print(sys.executable)' 2>/dev/null || \
	ls -d $${PYENV_ROOT:-$$HOME/.pyenv}/versions/3.8*/bin/python3.8 2>/dev/null | sort -V | tail -n 1)
T20_VENV := .venv-t20
T20_PY := $(T20_VENV)/bin/python
T20_STAMP := $(T20_VENV)/.mmgcu-installed

install-t20: $(T20_STAMP)

$(T20_STAMP): setup.py requirements/runtime.txt requirements/optional.txt requirements/tests.txt requirements/build.txt requirements/t20-vendor.txt requirements/t20-models.txt tools/install_t20.sh
	@test -n "$(PYTHON38)" && $(PYTHON38) -c 'import sys; assert sys.version_info[:2] == (3, 8)' || \
		{ echo "install-t20: no Python 3.8 found; run make install-t20 PYTHON38=/path/to/python3.8" >&2; exit 1; }
	test -x $(T20_PY) || $(PYTHON38) -m venv $(T20_VENV)
	$(T20_PY) -m pip install --quiet -r requirements/t20-vendor.txt
	tools/install_t20.sh $(T20_PY)
	$(T20_PY) -m pip install --quiet -c <($(T20_PY) -c 'import torch; print("torch==" + torch.__version__)') -r requirements/tests.txt
	# Pre-build the simulator's C++ part for torch 1.10 (as a script: importing the mmgcu
	# package is not needed to build it).
	$(T20_PY) mmgcu/sim/build.py
	touch $(T20_STAMP)
