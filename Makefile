# mmgcu: one-command set-up. Every target is idempotent and works on a fresh machine.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# torch comes from the local CPU wheel; an unpinned torch would pull the CUDA build.
TORCH_VERSION := 2.13.0
STAMP := $(VENV)/.mmgcu-installed

.PHONY: install install-t20 test demo bench lint clean-venv

install: $(STAMP)

$(STAMP): setup.py requirements/runtime.txt requirements/optional.txt requirements/tests.txt requirements/build.txt
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PIP) install --quiet torch==$(TORCH_VERSION)
	$(PIP) install --quiet -r requirements/build.txt
	# mmcv with compiled ops; pip caches the built wheel, so only the first machine-wide build is slow.
	$(PY) -c "import mmcv._ext" 2>/dev/null || \
		MMCV_WITH_OPS=1 FORCE_CUDA=0 $(PIP) install --no-build-isolation mmcv==2.1.0
	$(PIP) install --quiet -r requirements/runtime.txt -r requirements/optional.txt -r requirements/tests.txt
	$(PIP) install --quiet --no-build-isolation --no-deps -e .
	# Pre-build the simulator's C++ part once, so many ranks starting together find it cached.
	MMGCU_SIMULATE=1 $(PY) -m mmgcu.sim.build
	touch $(STAMP)

test: install lint
	$(PY) -m pytest

# The main job on 8 simulated GCUs: stock mmseg tools/train.py through tools/dist_train.sh.
DEMO_CONFIG := configs/tiny/fcn_r18-tiny_8xgcu_synthetic-64x64.py
DEMO_WORK := work_dirs/demo
demo: install
	$(PY) tools/make_synthetic_dataset.py data/synthetic
	rm -rf $(DEMO_WORK) && mkdir -p $(DEMO_WORK)
	set -o pipefail; MMGCU_SIMULATE=8 PYTHON=$(PY) tools/dist_train.sh $(DEMO_CONFIG) \
		--work-dir $(DEMO_WORK) 2>&1 | tee $(DEMO_WORK)/demo.log
	@echo "---------------------------------------------------------------------------"
	@grep -h "mIoU:" $(DEMO_WORK)/demo.log | tail -n 1 | sed 's/.*- INFO - /validation: /'
	@echo "checkpoint: $$(cat $(DEMO_WORK)/last_checkpoint)"

# What mmgcu costs: per-iteration overhead, start-up, the 8-card rehearsal (both torch_gcu
# APIs, --amp, gcu1 against the code before the 1.x rebuild), the simulator's cost per op,
# card reads per iteration, one SyncBN layer. BENCH_ARGS=--quick for a smoke run, --check to
# fail when a target is missed.
BENCH_ARGS ?=
bench: install
	$(PY) tools/benchmarks/bench.py --out bench_results/bench.json $(BENCH_ARGS)

# ruff, and the T20 stack's Python: everything outside the v2 backend must parse on 3.8.
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/vermin -t=3.8- --violations --no-tips --eval-annotations mmgcu tools setup.py

# The T20's own stack (Python 3.8, torch 1.10 under torch_gcu 1.x) in .venv-t20: the vendor's
# stack is stood in for by requirements/t20-vendor.txt, then mmgcu goes in as a T20 user
# installs it into the vendor's environment (tools/install_t20.sh, which keeps its torch).
# PYTHON38=/path/to/python3.8 picks the interpreter; by default python3.8 if it runs, else pyenv's.
PYTHON38 ?= $(shell python3.8 -c 'import sys; print(sys.executable)' 2>/dev/null || \
	ls -d $(HOME)/.pyenv/versions/3.8*/bin/python3.8 /root/.pyenv/versions/3.8*/bin/python3.8 \
	2>/dev/null | sort -V | tail -n 1)
T20_VENV := .venv-t20
T20_PY := $(T20_VENV)/bin/python
T20_STAMP := $(T20_VENV)/.mmgcu-installed

install-t20: $(T20_STAMP)

$(T20_STAMP): setup.py requirements/runtime.txt requirements/optional.txt requirements/tests.txt requirements/build.txt requirements/t20-vendor.txt tools/install_t20.sh
	@test -n "$(PYTHON38)" && $(PYTHON38) -c 'import sys; assert sys.version_info[:2] == (3, 8)' || \
		{ echo "install-t20: no Python 3.8 found; run make install-t20 PYTHON38=/path/to/python3.8" >&2; exit 1; }
	test -x $(T20_PY) || $(PYTHON38) -m venv $(T20_VENV)
	$(T20_PY) -m pip install --quiet -r requirements/t20-vendor.txt
	tools/install_t20.sh $(T20_PY)
	# Pre-build the simulator's C++ part for torch 1.10 (as a script: importing the mmgcu
	# package is not needed to build it).
	$(T20_PY) mmgcu/sim/build.py
	touch $(T20_STAMP)
