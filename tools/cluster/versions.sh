#!/usr/bin/env bash
# make versions: the Kubernetes releases users run, beyond the one CI tests (tools/cluster/k8s). For each wrapper
# module in tools/cluster/k8s-versions/<minor> (written by wrapper.sh), or those named in $VERSIONS: build its
# control plane and kubelet (build.sh with QP_K8S_WRAPPER; etcd, KWOK, Helm and NTH as pinned), run the tests
# on the real control plane (-m real: drains, PodDisruptionBudgets, node Leases, Events, least privilege, the
# kubectl drain parity, the chaos cases) against it, then make e2e's storm. One line per release at the end:
# what README.md's "Kubernetes versions" table records. Exit status 0 only when every release passed.
set -uo pipefail
here="$(cd "$(dirname "$0")" && pwd)"
root="$(cd "$here/../.." && pwd)"
cd "$root"
versions="${VERSIONS:-$(cd "$here/k8s-versions" && ls)}"
results=() status=0
for minor in $versions; do
    wrapper="k8s-versions/$minor"
    if ! QP_K8S_WRAPPER="$wrapper" "$here/build.sh"; then
        results+=("Kubernetes $minor: build failed"); status=1; continue
    fi
    bin="$(QP_K8S_WRAPPER="$wrapper" "$here/build.sh" --print-dir)"
    start=$SECONDS
    QP_CLUSTER_BIN="$bin" QP_REQUIRE_REAL_CLUSTER=1 .venv/bin/pytest -n "${TEST_WORKERS:-4}" -m real -q \
        -p no:cacheprovider tests/sandbox tests/integration tests/chaos > "/tmp/versions-$minor.log" 2>&1
    tests=$?
    summary="$(grep -E '[0-9]+ (passed|failed)' "/tmp/versions-$minor.log" | tail -1 | tr -d '=' | xargs)"
    e2e="$(tools/image/build.sh >/dev/null && QP_CLUSTER_BIN="$bin" .venv/bin/python -m queue_processor_sandbox.e2e 2>/dev/null | tail -1)"
    e2e_status=$?
    verdict="$(printf '%s' "$e2e" | python3 -c 'import json,sys; s=json.load(sys.stdin); print(s["kubernetes"], "drained", s["drained"], "of", s["nodes"], "messages_left", s["messages_left"])' 2>/dev/null || echo "no summary")"
    results+=("Kubernetes $minor: tests exit $tests (${summary:-no summary}, log /tmp/versions-$minor.log), e2e exit $e2e_status ($verdict), $((SECONDS - start)) s")
    [[ $tests -eq 0 && $e2e_status -eq 0 ]] || status=1
done
tools/image/daemon.sh stop
printf '%s\n' "${results[@]}"
exit $status
