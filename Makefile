# Two commands do everything on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed
RUNTIME := $(VENV)/.runtime

.PHONY: demo test lint typecheck unit bench clean prometheus lock image

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip

# What running needs (make demo), and on top of it what testing needs (make test).
$(RUNTIME): $(BIN)/python pyproject.toml
	$(BIN)/python -m pip install --quiet -e .
	touch $(RUNTIME)

$(STAMP): $(RUNTIME) pyproject.toml
	$(BIN)/python -m pip install --quiet -e '.[test]'
	touch $(STAMP)

demo: $(RUNTIME)
	$(BIN)/weight-controller demo $(DEMO_ARGS)

lint: $(STAMP)
	$(BIN)/ruff check controller tests benchmarks
	$(BIN)/ruff format --check controller tests benchmarks
	$(BIN)/hadolint --failure-threshold info Dockerfile

typecheck: $(STAMP)
	$(BIN)/mypy --strict controller tests benchmarks

# The Prometheus tests run Debian's prometheus/promtool; install them when missing (CI is root).
prometheus:
	@command -v prometheus >/dev/null && command -v promtool >/dev/null || { \
	  echo "installing Debian's prometheus package (needs root)"; \
	  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends prometheus >/dev/null; }

# A file per worker (its module fixtures, a Prometheus or a Ray head, are started once), as
# many workers as cores up to 4: CI's two cores take ~60% of the serial time.
unit: $(STAMP) prometheus
	$(BIN)/pytest -n auto --maxprocesses 4 --dist loadfile

test: lint typecheck unit

bench: $(STAMP)
	$(BIN)/python benchmarks/bench_exposition.py
	$(BIN)/python benchmarks/bench_fetch.py
	$(BIN)/python benchmarks/bench_logs.py
	$(BIN)/python benchmarks/bench_daemon.py
	$(BIN)/python benchmarks/bench_daemon.py --epp
	$(BIN)/python benchmarks/bench_peers.py
	$(BIN)/python benchmarks/bench_peers.py --no-epp
	$(BIN)/python benchmarks/bench_prometheus.py
	$(BIN)/python benchmarks/bench_queriers.py
	$(BIN)/python benchmarks/bench_replay.py

# What the image installs, exactly, with hashes (requirements.lock): re-run after changing
# pyproject.toml's dependencies; tests/integration/test_lock.py says when it is due.
LOCKENV := .venv-lock
lock:
	test -x $(LOCKENV)/bin/pip-compile || { $(PYTHON) -m venv $(LOCKENV) && $(LOCKENV)/bin/pip install --quiet pip-tools; }
	$(LOCKENV)/bin/pip-compile --quiet --generate-hashes --strip-extras --allow-unsafe \
	  --no-emit-index-url --no-emit-find-links --output-file requirements.lock pyproject.toml

# The image, with whichever engine is here (podman, docker or buildah).
IMAGE ?= quay.io/opendatahub/weight-controller:0.1.0
image:
	@engine=$$(command -v podman || command -v docker || command -v buildah) || { \
	  echo "make image needs podman, docker or buildah; none is installed" >&2; exit 1; }; \
	case $$engine in *buildah) set -- bud;; *) set -- build;; esac; \
	$$engine "$$@" -t $(IMAGE) .

clean:
	rm -rf $(VENV) $(LOCKENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis
