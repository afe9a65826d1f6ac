# mmgcu: one-command set-up. Every target is idempotent and works on a fresh machine.
SHELL := /bin/bash
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
PIP := $(PY) -m pip
# torch comes from the local CPU wheel; an unpinned torch would pull the CUDA build.
TORCH_VERSION := 2.13.0
STAMP := $(VENV)/.mmgcu-installed

.PHONY: install test demo bench lint clean-venv

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
	# Pre-build the simulator's C++ part once, so many ranks starting together find it cached.
	MMGCU_SIMULATE=1 $(PY) -m mmgcu.sim.build
	touch $(STAMP)

test: install lint
	$(PY) -m pytest

# The main job on 8 simulated GCUs: stock mmseg tools/train.py through tools/dist_train.sh
# (mmgcu train), 40 iterations that learn; then the loss and mIoU curves and a few
# predictions as PNG files, and what was learnt next to the background-only baseline.
DEMO_CONFIG := configs/tiny/fcn_r18-tiny-d8_8xgcu-40it_synthetic-64x64.py
DEMO_WORK := work_dirs/demo
demo: install
	$(PY) tools/make_synthetic_dataset.py data/synthetic
	rm -rf $(DEMO_WORK) && mkdir -p $(DEMO_WORK)
	@set -o pipefail; start=$$(date +%s); \
	MMGCU_SIMULATE=8 PYTHON=$(PY) tools/dist_train.sh $(DEMO_CONFIG) --work-dir $(DEMO_WORK) 2>&1 \
		| tee $(DEMO_WORK)/demo.log && \
	echo "---------------------------------------------------------------------------" && \
	echo "8 simulated GCU cards, $(DEMO_CONFIG): $$(( $$(date +%s) - start )) s" && \
	$(PY) tools/plot_demo.py $(DEMO_WORK) && \
	echo "log:         $(DEMO_WORK)/demo.log" && \
	echo "Rehearse your own config the same way:" && \
	echo "  source .venv/bin/activate && MMGCU_SIMULATE=8 mmgcu train CONFIG"

# What mmgcu costs: per-iteration overhead, start-up, the 8-card rehearsal, the simulator's
# cost per op. BENCH_ARGS=--quick for a smoke run, --check to fail when a target is missed.
BENCH_ARGS ?=
bench: install
	$(PY) tools/benchmarks/bench.py --out bench_results/bench.json $(BENCH_ARGS)

# ruff, and the T20 stack's Python: everything outside the v2 backend must parse on 3.8.
lint: install
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/vermin -t=3.8- --violations --no-tips --eval-annotations mmgcu tools setup.py
