# syntax=docker/dockerfile:1
#
# queue-processor's container image.
#
#   docker build --build-arg VERSION=0.1.0 --build-arg REVISION="$(git rev-parse HEAD)" \
#                --build-arg SOURCE_URL=https://github.com/<owner>/<repo> -t queue-processor:0.1.0 .
#
# Two stages on the same Python image: the builder turns the source tree into a wheel and installs it, with the
# runtime dependencies pinned by constraints.txt (not the `dev` extra; the sandbox is a distribution of its own,
# sandbox/, never copied here), into a virtual environment
# at /opt/venv; the final stage copies that directory and nothing else, so no build tool, wheel or pip cache
# reaches it. Every dependency installs from a binary wheel (--only-binary), so no compiler is needed anywhere.
#
# Runtime contract (what the Helm chart relies on):
# - numeric non-root user 65532:65532, so `runAsNonRoot: true` can be verified by the kubelet;
# - a read-only root filesystem works: the controller writes nothing to disk. It logs to stderr (structlog), keeps
#   its Prometheus metrics in memory (prometheus-client writes files only in multiprocess mode, which is off
#   unless PROMETHEUS_MULTIPROC_DIR is set; do not set it), and the in-cluster Kubernetes configuration is only
#   read. Python writes no bytecode (PYTHONDONTWRITEBYTECODE); /opt/venv is compiled at build time. Temporary
#   files, if a library ever needs one (the kubernetes client does for certificates inlined in a kubeconfig),
#   go to /tmp, where the chart mounts an emptyDir.
# - ports: PROBES_SERVER_PORT (8080: /healthz, /readyz) and PROMETHEUS_SERVER_PORT (9092: /metrics), the
#   defaults in queue_processor/config.py.

# The same image for both stages: the virtual environment's interpreter is a link to /usr/local/bin/python3.11,
# which must exist, at the same version, where the environment is used. Patch release and Debian release are
# pinned; bump them together (docker-library/python publishes python:<x.y.z>-slim-<debian>).
ARG PYTHON_IMAGE=python:3.11.15-slim-trixie

FROM ${PYTHON_IMAGE} AS builder

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PIP_ROOT_USER_ACTION=ignore \
    PYTHONDONTWRITEBYTECODE=1

WORKDIR /src
# What the wheels are built from: pyproject.toml names README.md as its readme, the package itself, and the
# Go-template distribution it depends on (gotemplate/).
COPY pyproject.toml constraints.txt README.md ./
COPY queue_processor/ queue_processor/
COPY gotemplate/ gotemplate/

# 1. Build the project's wheels (pip fetches the build backend named in pyproject.toml's [build-system]).
# 2. Install them with their runtime dependencies at the pinned versions into a virtual environment created
#    without pip or setuptools: the base image's pip installs into it (--python), so the final image carries
#    no packaging tools in /opt/venv.
# 3. Compile the environment's bytecode with hashes that are never re-checked: the image is immutable, and
#    nothing is compiled (or written) at run time whatever timestamps the copy keeps.
RUN python -m pip wheel --no-deps --wheel-dir /wheels . ./gotemplate \
    && python -m venv --without-pip /opt/venv \
    && python -m pip --python /opt/venv/bin/python install --only-binary=:all: \
        -c constraints.txt /wheels/queue_processor-*.whl /wheels/queue_processor_gotemplate-*.whl \
    && python -m compileall -q --invalidation-mode unchecked-hash /opt/venv/lib


FROM ${PYTHON_IMAGE}

ARG VERSION=0.1.0
ARG REVISION=""
ARG SOURCE_URL=""

LABEL org.opencontainers.image.title="queue-processor" \
      org.opencontainers.image.description="Kubernetes controller that drains nodes gracefully when their EC2 instances go away (SQS queue-processor, NTH-compatible)" \
      org.opencontainers.image.version="${VERSION}" \
      org.opencontainers.image.revision="${REVISION}" \
      org.opencontainers.image.source="${SOURCE_URL}" \
      org.opencontainers.image.licenses="Apache-2.0"

# A named account for the numeric user, so tools that look the user up (id, ps, getpass) find one. Its home
# does not exist: nothing is meant to be written there.
RUN groupadd --system --gid 65532 nonroot \
    && useradd --system --no-log-init --uid 65532 --gid 65532 \
        --home-dir /nonexistent --no-create-home --shell /usr/sbin/nologin nonroot

COPY --from=builder /opt/venv /opt/venv

ENV PATH=/opt/venv/bin:${PATH} \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1

USER 65532:65532

EXPOSE 8080 9092

# No HEALTHCHECK: Kubernetes ignores Docker health checks; the chart's liveness and readiness probes call
# /healthz and /readyz on PROBES_SERVER_PORT instead. Under plain Docker, add --health-cmd if wanted.

# SIGTERM (the kubelet's stop signal) reaches the controller directly (exec form, PID 1): it stops receiving,
# makes every message in flight visible again and exits. Flags or environment variables configure it.
ENTRYPOINT ["queue-processor", "run"]
