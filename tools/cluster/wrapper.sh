#!/usr/bin/env bash
# Writes the wrapper module that builds Kubernetes release <version> (tools/cluster/README.md: why a wrapper)
# into <dir>: its go.mod requires k8s.io/kubernetes <version>, replaces each staging module the release's own
# go.mod points at ./staging/src/... with the published v0.<minor>.<patch>, keeps the release's go and godebug
# lines, lists the binaries as tool directives, and `go mod tidy` fills go.sum from the Go module proxy.
#
# Usage: tools/cluster/wrapper.sh v1.37.2 tools/cluster/k8s-versions/1.37
set -euo pipefail
version="$1" dir="$2"
staging="v0.${version#v1.}"
export GOFLAGS="-mod=mod" GOTOOLCHAIN=local
upstream="$(go mod download -json "k8s.io/kubernetes@$version" | sed -n 's/^\s*"GoMod": "\(.*\)",$/\1/p')"
[[ -f "$upstream" ]] || { echo "wrapper.sh: no go.mod for k8s.io/kubernetes@$version" >&2; exit 2; }
mkdir -p "$dir"
{
    echo "// Wrapper module: builds the control plane and kubelet of Kubernetes $version from the Go module proxy,"
    echo "// for tests only; written by tools/cluster/wrapper.sh (tools/cluster/README.md)."
    echo "module queue-processor.test/cluster/k8s-${version#v}"
    echo
    grep -E '^(go|godebug) ' "$upstream"
    echo
    echo "require k8s.io/kubernetes $version"
    echo
    echo "tool ("
    for cmd in kube-apiserver kube-controller-manager kube-scheduler kubectl kubelet; do
        echo "	k8s.io/kubernetes/cmd/$cmd"
    done
    echo ")"
    echo
    echo "replace ("
    sed -n 's|^\s*\(k8s.io/[a-z0-9-]*\) => ./staging/src/.*$|\1|p' "$upstream" | sort -u | while read -r module; do
        echo "	$module => $module $staging"
    done
    echo ")"
} > "$dir/go.mod"
(cd "$dir" && go mod tidy)
echo "wrapper.sh: $dir/go.mod for Kubernetes $version"
