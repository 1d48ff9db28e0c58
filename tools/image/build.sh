#!/usr/bin/env bash
# Builds the controller's image from the Dockerfile as a user would (`docker build`), on a base made here.
#
# No registry image can be pulled on the machines this project is built on, so the Dockerfile's default base
# (python:<x.y.z>-slim-<debian>, what users get) is replaced through its PYTHON_IMAGE build argument by a
# Debian bookworm root filesystem made with mmdebstrap from Debian's packages (python3, python3-venv,
# python3-pip, passwd, ca-certificates) and `docker import`ed as $base. The machine's CA bundle is copied into
# that base, so that pip inside the build reaches the package registry the machine reaches (--network host).
# The legacy builder is used (DOCKER_BUILDKIT=0): BuildKit would fetch its Dockerfile frontend from a registry.
#
# Usage: tools/image/build.sh [TAG]   (default queue-processor:dev). Starts dockerd when none runs, and
# installs docker.io and mmdebstrap when missing (tools/image/daemon.sh says so; `daemon.sh stop` stops it).
# Prints the image's tag, id and size as its last line.
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
tag="${1:-queue-processor:dev}"
cache="${QP_IMAGE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/queue-processor/image}"
packages="python3,python3-venv,python3-pip,python-is-python3,passwd,ca-certificates"
suite=bookworm
# The base's name carries what it is made of: a change of packages or suite makes a new one.
base="queue-processor-base:$suite-$(printf '%s %s' "$suite" "$packages" | sha256sum | cut -c1-12)"

"$here/daemon.sh" start

if ! docker image inspect "$base" >/dev/null 2>&1; then
    echo "build.sh: making the base $base with mmdebstrap ($suite: $packages)"
    mkdir -p "$cache"
    mmdebstrap --quiet --variant=minbase --include="$packages" \
        --customize-hook='copy-in /etc/ssl/certs/ca-certificates.crt /etc/ssl/certs/' \
        "$suite" "$cache/base.tar" >"$cache/mmdebstrap.log" 2>&1 \
        || { echo "build.sh: mmdebstrap failed: see $cache/mmdebstrap.log" >&2; exit 2; }
    docker import "$cache/base.tar" "$base" >/dev/null
    rm -f "$cache/base.tar"
fi

version="$(sed -n 's/^version = "\(.*\)"/\1/p' "$root/pyproject.toml" | head -1)"
revision="$(git -C "$root" rev-parse HEAD 2>/dev/null || echo unknown)"
echo "build.sh: docker build -t $tag (base $base)"
DOCKER_BUILDKIT=0 docker build --quiet --network host \
    --build-arg PYTHON_IMAGE="$base" --build-arg VERSION="$version" --build-arg REVISION="$revision" \
    -t "$tag" "$root" >"$cache/build.log" 2>&1 \
    || { echo "build.sh: docker build failed: tail of $cache/build.log:" >&2; tail -20 "$cache/build.log" >&2; exit 1; }
docker image inspect -f "{{index .RepoTags 0}} {{.Id}} {{.Size}} bytes" "$tag"
