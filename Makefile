# One command each: make test, make lint, make demo, make bench. Each creates or refreshes .venv.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed-$(shell cat pyproject.toml | sha1sum | cut -c1-12)
PYTEST_ARGS ?=
# The image `make image` builds: the chart's default (helm/reins/values.yaml, image.repository)
# at the package's version (the chart's appVersion; tests/ops/test_image_tag.py checks both).
VERSION := $(shell sed -n 's/^version = "\(.*\)"/\1/p' pyproject.toml)
IMAGE_REPOSITORY ?= ghcr.io/reins/reins
IMAGE ?= $(IMAGE_REPOSITORY):$(VERSION)

.PHONY: all venv lint test test-fast demo bench redis rabbitmq tools image image-name clean

all: lint test

$(STAMP): pyproject.toml
	@test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip >/dev/null 2>&1 || true
	$(PY) -m pip install -q -e '.[dev,bench,plot]'
	@rm -f $(VENV)/.installed-*
	@touch $@

venv: $(STAMP)

redis:
	@bash ops/scripts/ensure-redis.sh

# The fleet tests run on RabbitMQ as well: check that one answers (never installs it).
rabbitmq: venv
	@PYTHON=$(PY) bash ops/scripts/ensure-rabbitmq.sh

# helm at .tools/helm, a prometheus binary and a headless chromium with its chromedriver, for
# the chart, dashboard and console (browser) tests; mmdebstrap, buildah, podman and runc for
# the image and its test.
tools:
	@bash ops/scripts/ensure-helm.sh
	@bash ops/scripts/ensure-image-tools.sh
	@bash ops/scripts/ensure-prometheus.sh
	@bash ops/scripts/ensure-chromium.sh

# The Dockerfile, built here with buildah on a Debian base bootstrapped locally (no registry).
image:
	@bash ops/scripts/ensure-image-tools.sh
	@IMAGE=$(IMAGE) bash ops/scripts/build-image.sh

image-name:
	@echo $(IMAGE)

lint: venv
	$(VENV)/bin/ruff check .
	$(VENV)/bin/ruff format --check .
	$(VENV)/bin/mypy kernel store router worker api ops examples
	$(VENV)/bin/lint-imports

# The whole suite, chaos runs included (CI runs exactly this).
test: venv redis rabbitmq tools lint
	$(VENV)/bin/pytest $(PYTEST_ARGS)

# For a quick local loop: skips the runs marked slow.
test-fast: venv redis rabbitmq
	$(VENV)/bin/pytest -m "not slow" $(PYTEST_ARGS)

demo: venv
	$(VENV)/bin/reins demo

bench: venv redis
	@for b in kernel ring admitter store fleet api provider; do $(VENV)/bin/reins bench $$b --json; done

clean:
	rm -rf $(VENV) .reins .pytest_cache .mypy_cache .ruff_cache
