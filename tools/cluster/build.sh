#!/usr/bin/env bash
# Builds the real Kubernetes control plane the tests run against, from the Go module proxy:
# kube-apiserver, kube-controller-manager, kube-scheduler and kubectl (tools/cluster/k8s), etcd
# (tools/cluster/etcd), the KWOK controller (tools/cluster/kwok), the peer, aws-node-termination-handler
# (tools/cluster/nth), and Helm (tools/cluster/helm).
#
# Versions live in the wrapper modules' go.mod files and nowhere else; this script reads them.
# Binaries go to $QP_CLUSTER_CACHE/<component>/<version>/ (default ~/.cache/queue-processor/cluster),
# outside the clone so that a fresh clone on a machine that built them once reuses them. A component
# whose go.mod, go.sum, build flags and packages are unchanged since its last build is not built again.
#
# Usage: tools/cluster/build.sh [--print-dir]   (--print-dir prints the bin directory and builds nothing)
set -euo pipefail

here="$(cd "$(dirname "$0")" && pwd)"
cache="${QP_CLUSTER_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/queue-processor/cluster}"
export CGO_ENABLED=0 GOTOOLCHAIN=local GOFLAGS="-mod=readonly -buildvcs=false"

command -v go >/dev/null || { echo "build.sh: go not found on PATH (Go >= 1.26 is needed: Helm v3.22's module asks for it)" >&2; exit 2; }

version_of() { (cd "$here/$1" && go list -m -f '{{.Version}}' "$2"); }

# QP_K8S_WRAPPER: another Kubernetes release's wrapper (tools/cluster/k8s-versions/<minor>, written by
# wrapper.sh) for `make versions`; its binaries go to a directory named after that release.
k8s_dir="${QP_K8S_WRAPPER:-k8s}"
k8s_version="$(version_of "$k8s_dir" k8s.io/kubernetes)"
etcd_version="$(version_of etcd go.etcd.io/etcd/server/v3)"
kwok_version="$(version_of kwok sigs.k8s.io/kwok)"
bin="$cache/k8s-$k8s_version-etcd-$etcd_version-kwok-$kwok_version/bin"

if [[ "${1:-}" == "--print-dir" ]]; then
    echo "$bin"
    exit 0
fi

mkdir -p "$bin"

# stamp of a build: the wrapper module's go.mod and go.sum, its own Go sources if it has any (nth/webhookrender),
# the flags and the packages (not this whole script, so that a change elsewhere in it rebuilds nothing)
stamp_of() {
    { cat "$here/$1/go.mod" "$here/$1/go.sum"; find "$here/$1" -name '*.go' -print0 | sort -z | xargs -0r cat
      shift; printf '%s\n' "$BUILD_FLAGS" "$@"; } | sha256sum | cut -d' ' -f1
}
BUILD_FLAGS="-trimpath -tags selinux,notest"

build() { # build <wrapper dir> <ldflags> <binary name=package>...
    local dir="$1" ldflags="$2"; shift 2
    local stamp; stamp="$(stamp_of "$dir" "$ldflags" "$@")"
    local missing=()
    for pair in "$@"; do
        local name="${pair%%=*}"
        if [[ ! -x "$bin/$name" || "$(cat "$bin/.$name.stamp" 2>/dev/null)" != "$stamp" ]]; then
            missing+=("$pair")
        fi
    done
    if [[ ${#missing[@]} -eq 0 ]]; then
        echo "build.sh: $dir up to date in $bin"
        return
    fi
    local start=$SECONDS
    for pair in "${missing[@]}"; do
        local name="${pair%%=*}" pkg="${pair#*=}"
        echo "build.sh: building $name ($pkg)"
        (cd "$here/$dir" && go build $BUILD_FLAGS -ldflags "$ldflags" -o "$bin/$name.tmp" "$pkg")
        mv "$bin/$name.tmp" "$bin/$name"
        echo "$stamp" > "$bin/.$name.stamp"
    done
    echo "build.sh: $dir built in $((SECONDS - start)) s"
}

# The version variables upstream's hack/lib/version.sh sets, so that /version and kubectl tell the truth.
minor="${k8s_version#v1.}"; minor="${minor%%.*}"
k8s_ldflags="-s -w"
for pkg in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    k8s_ldflags+=" -X $pkg.gitVersion=$k8s_version -X $pkg.gitMajor=1 -X $pkg.gitMinor=$minor"
    k8s_ldflags+=" -X $pkg.gitCommit= -X $pkg.gitTreeState=clean -X $pkg.buildDate=1970-01-01T00:00:00Z"
done

build "$k8s_dir" "$k8s_ldflags" \
    kube-apiserver=k8s.io/kubernetes/cmd/kube-apiserver \
    kube-controller-manager=k8s.io/kubernetes/cmd/kube-controller-manager \
    kube-scheduler=k8s.io/kubernetes/cmd/kube-scheduler \
    kubectl=k8s.io/kubernetes/cmd/kubectl
# The real node beside the KWOK ones (sandbox/queue_processor_sandbox/real_node.py): a kubelet of the same
# release, and a pause binary for its pods' sandbox image.
build "$k8s_dir" "$k8s_ldflags" kubelet=k8s.io/kubernetes/cmd/kubelet
build pause "-s -w" pause=.
build etcd "-s -w" etcd=go.etcd.io/etcd/server/v3
build kwok "-s -w -X sigs.k8s.io/kwok/pkg/consts.Version=$kwok_version" kwok=sigs.k8s.io/kwok/cmd/kwok
# The peer (tests/peers, benchmarks/versus_nth.py): aws-node-termination-handler, pinned in nth/go.mod. Its
# version is in the stamp (go.mod), not in the directory name, so adding it rebuilt nothing else.
# webhookrender (tests/migration) renders webhook bodies with NTH's own pkg/webhook.
build nth "-s -w" node-termination-handler=github.com/aws/aws-node-termination-handler/cmd \
    webhookrender=./webhookrender
# Helm (tests/deploy/test_helm.py installs, upgrades, rolls back and uninstalls the chart with it), pinned in
# helm/go.mod; its version in its stamp, as NTH's.
# Its default Kubernetes version (helm template, helm lint) is that of its client-go, set as its Makefile does.
helm_version="$(version_of helm helm.sh/helm/v3)"
client_go="$(version_of helm k8s.io/client-go)"; client_go_minor="${client_go#v0.}"; client_go_minor="${client_go_minor%%.*}"
helm_ldflags="-s -w -X helm.sh/helm/v3/internal/version.version=$helm_version"
for pkg in helm.sh/helm/v3/pkg/lint/rules helm.sh/helm/v3/pkg/chartutil; do
    helm_ldflags+=" -X $pkg.k8sVersionMajor=1 -X $pkg.k8sVersionMinor=$client_go_minor"
done
build helm "$helm_ldflags" helm=helm.sh/helm/v3/cmd/helm
du -sh "$bin" | sed 's/^/build.sh: size of /'
