# vllm-uma: the two commands of the quick start, plus helpers.
#   make serve   set up .venv, prepare the default model, serve on HOST:PORT
#   make test    set up .venv, then run every test (unit and end-to-end)
#   make bench   what KV offloading gains here (about 15-20 min; docs/benchmark.md)

VENV  ?= .venv
HOST  ?= 127.0.0.1
PORT  ?= 8000
ARGS  ?=
PYTEST_ARGS ?=
BENCH_ARGS ?=

STAMP := $(VENV)/.vllm-uma-installed
BENCH_STAMP := $(VENV)/.vllm-uma-bench-installed
BIN   := $(VENV)/bin

.PHONY: serve test test-unit install model bench bench-memory bench-offload clean

$(STAMP): pyproject.toml scripts/install.sh
	bash scripts/install.sh $(VENV)
	touch $@

install: $(STAMP)

# The benchmark's own extra (matplotlib for the chart), on top of install.
$(BENCH_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -e '.[test,bench]'
	touch $@

model: $(STAMP)
	$(BIN)/vllm-uma prepare-model

serve: model
	$(BIN)/vllm-uma serve --host $(HOST) --port $(PORT) $(ARGS)

# pytest exits 5 when it collected no test: that is a broken suite, not a pass.
test: model
	@$(BIN)/python -m pytest $(PYTEST_ARGS); rc=$$?; \
	if [ $$rc -eq 5 ]; then echo "make test: pytest collected no tests; failing." >&2; fi; \
	exit $$rc

test-unit: $(STAMP)
	$(BIN)/python -m pytest -m "not slow" $(PYTEST_ARGS)

# Worker RSS of the plugin against stock vLLM CPU (prints a table, writes JSON).
bench-memory: model
	$(BIN)/python tools/benchmark/memory_benchmark.py --startup-under-pressure 6 --out bench-out/memory_benchmark.json

# KV offloading: TTFT of an L2 restore against an L1 hit and a recompute,
# the cost with no reuse, a restart served from the disk tier, the L1<->L2
# copy bandwidth beside memcpy, and the disk tier's restore bandwidth
# beside the disk's own read bandwidth.
bench-offload: model
	$(BIN)/python tools/benchmark/kv_offload_ttft.py
	$(BIN)/python tools/benchmark/kv_pool_bandwidth.py
	$(BIN)/python tools/benchmark/disk_tier_bandwidth.py

# KV offloading, four workloads x off / host pool / pool + disk tier, a
# fresh server each: JSON, PNG chart and server logs in bench-out/.
bench: model $(BENCH_STAMP)
	$(BIN)/python tools/benchmark/kv_offload_benchmark.py --out bench-out/kv_offload_benchmark.json $(BENCH_ARGS)

clean:
	rm -rf $(VENV) build *.egg-info .pytest_cache
