# Two entry points for a fresh machine with Python 3.11 (see README "Quickstart"):
#   make demo   set up .venv and run the main job on the embedded sandbox (a 20-node cluster, a scenario)
#   make test   set up .venv, build the real control plane when Go is there (make cluster-bin), and run every
#               check: ruff, ruff format, mypy --strict, pytest
# Between changes: make check (lint, types, and every test but those on the real control plane or beside NTH).
PYTHON ?= $(shell command -v python3.11 2>/dev/null || command -v python3)
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
# checkov (Terraform checks) pins libraries the controller also uses; it gets a venv of its own.
CHECKOV_VENV := .venv-checkov
CHECKOV := $(CHECKOV_VENV)/bin/checkov
CHECKOV_VERSION := 3.3.30
# The suite waits more than it computes (sandboxes, timers, controllers in their own processes): pytest-xdist
# runs it on several workers, each with its own sandboxes and, when a test needs it, its own control plane.
TEST_WORKERS ?= 4
CHECK_WORKERS ?= 6

.PHONY: setup demo test check lint typecheck unit bench storm soak explore versus-nth docs lock clean cluster-bin cluster-bin-if-go image e2e versions

$(STAMP): pyproject.toml sandbox/pyproject.toml gotemplate/pyproject.toml constraints.txt
	@$(PYTHON) -c 'import sys; sys.exit(0 if sys.version_info >= (3, 11) else "queue-processor needs Python >= 3.11, found " + sys.version.split()[0])'
	test -x $(BIN)/python || $(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -c constraints.txt -e ./gotemplate -e '.[dev]' -e ./sandbox
	touch $@

$(CHECKOV):
	test -x $(CHECKOV_VENV)/bin/python || $(PYTHON) -m venv $(CHECKOV_VENV)
	$(CHECKOV_VENV)/bin/python -m pip install --quiet --disable-pip-version-check checkov==$(CHECKOV_VERSION)

setup: $(STAMP) $(CHECKOV)

demo: $(STAMP)
	$(BIN)/queue-processor sandbox --nodes 20 --scale 0.05 --scenario mixed-duplicates

lint: $(STAMP)
	$(BIN)/ruff check .
	$(BIN)/ruff format --check .

typecheck: $(STAMP)
	$(BIN)/mypy --strict queue_processor gotemplate/queue_processor_gotemplate sandbox/queue_processor_sandbox

# The real Kubernetes control plane the tests judge the emulation and the controller against (etcd,
# kube-apiserver, kube-controller-manager, kube-scheduler, kubectl, kwok), built from the Go module proxy into
# ~/.cache/queue-processor/cluster (outside the clone; QP_CLUSTER_CACHE moves it). Warm: does nothing.
cluster-bin:
	tools/cluster/build.sh

# The controller's image from the Dockerfile, tagged queue-processor:dev, on a base made here from Debian's
# packages (no registry image can be pulled here; users build on the Dockerfile's default python base).
# Installs Debian's docker.io and mmdebstrap when missing (root), and starts dockerd when none runs (it says
# so; tools/image/daemon.sh stop stops it).
image:
	tools/image/build.sh

# The Kubernetes releases users run beyond the default (tools/cluster/versions.sh; README "Kubernetes versions"):
# each of tools/cluster/k8s-versions (VERSIONS="1.33 1.37" picks) built, the real-control-plane tests and the
# e2e storm run against it; one line per release at the end.
versions: $(STAMP) cluster-bin
	tools/cluster/versions.sh

# The install path end to end (sandbox/queue_processor_sandbox/e2e.py): the image, the real control plane with a
# real node (a kubelet: root), helm install of the chart, a Spot storm drained by the pod, helm uninstall, judged.
# Its last line is the sandbox's JSON summary; exit 0 only when the storm ended as expected. A dockerd it had to
# start is stopped after it.
e2e: $(STAMP) cluster-bin
	tools/image/build.sh && $(BIN)/python -m queue_processor_sandbox.e2e; status=$$?; tools/image/daemon.sh stop; exit $$status

# Without Go (a laptop), the tests that need the control plane skip with a reason; CI sets
# QP_REQUIRE_REAL_CLUSTER=1, which turns that skip into a failure.
cluster-bin-if-go:
	@if command -v go >/dev/null 2>&1; then tools/cluster/build.sh; \
	else echo "make: go not found: the tests on the real control plane will be skipped"; fi

# tests/image build the image themselves (tools/image/build.sh, as make image); a dockerd they had to start is
# stopped after them.
unit: $(STAMP) $(CHECKOV) cluster-bin-if-go
	$(BIN)/pytest -n $(TEST_WORKERS) --dist worksteal; status=$$?; tools/image/daemon.sh stop; exit $$status

test: lint typecheck unit

# The fast tier: what to run between changes (no Go, no control plane, no NTH needed).
check: lint typecheck $(STAMP) $(CHECKOV)
	$(BIN)/pytest -n $(CHECK_WORKERS) --dist worksteal -m "not real"

bench: $(STAMP)
	$(BIN)/python benchmarks/parse.py
	$(BIN)/python benchmarks/sandbox.py

storm: $(STAMP)
	$(BIN)/python benchmarks/storm.py

soak: $(STAMP)
	$(BIN)/python benchmarks/soak.py

# The storyline explorer (sandbox/queue_processor_sandbox/explore.py): SEEDS storylines from SEED_FROM (24
# from 0), or SEED=K to replay one; KUBERNETES=real runs them on the real control plane (built by cluster-bin).
SEEDS ?= 24
SEED_FROM ?= 0
KUBERNETES ?= emulated
explore: $(STAMP)
	@if [ "$(KUBERNETES)" = real ]; then $(MAKE) --no-print-directory cluster-bin; fi
	$(BIN)/python -m queue_processor_sandbox.explore --kubernetes $(KUBERNETES) \
		$(if $(SEED),--seed $(SEED),--seeds $(SEEDS) --seed-from $(SEED_FROM))

# queue-processor and aws-node-termination-handler on the same workloads (real control plane and NTH built by
# cluster-bin; matplotlib for the picture)
versus-nth: $(STAMP) cluster-bin
	$(BIN)/python -m pip install --quiet --disable-pip-version-check -c constraints.txt -e ./gotemplate -e '.[bench]'
	$(BIN)/python benchmarks/versus_nth.py

docs: $(STAMP)
	$(BIN)/queue-processor config --reference > docs/configuration.md

lock:
	rm -rf /tmp/queue-processor-lock && $(PYTHON) -m venv /tmp/queue-processor-lock
	/tmp/queue-processor-lock/bin/pip install --quiet ./gotemplate '.[dev,bench]' ./sandbox
	{ head -n 2 constraints.txt; /tmp/queue-processor-lock/bin/pip freeze --all | grep -v '^queue-processor\|^pip=='; } > constraints.txt.new
	mv constraints.txt.new constraints.txt

clean:
	rm -rf $(VENV) $(CHECKOV_VENV) .mypy_cache .ruff_cache .pytest_cache .hypothesis *.egg-info sandbox/*.egg-info gotemplate/*.egg-info
