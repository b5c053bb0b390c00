#!/usr/bin/env bash
# Runs every test tier: lint, a short fuzz pass over every config parser,
# unit tests, and root tests in namespaces the tests create. The go test
# run goes through hack/testreport: a line per package, the output of each
# failure, then every skipped test with its reason and the closing line
# "tests: N passed, N failed, N skipped". Under CI=true (.ci/run) nothing
# may skip: testutil.Skip fails the test instead.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/go/bin:$PATH
echo "== lint"
make -s lint
echo "== build"
make -s build
tmp=$(mktemp -d /tmp/flatnet-test.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
make -s install-cni DESTDIR="$tmp/cni" >/dev/null
export FLATNET_CNI_PATH=$tmp/cni
go build -o "$tmp/testreport" ./hack/testreport
if [ "$(id -u)" != 0 ]; then
  echo "== note: not root; root tests will skip (run as root to include them)"
else
  # The lab tests (test/e2e) run the upstream kube-apiserver and etcd:
  # build them into the cache (minutes the first time, a second after).
  echo "== k8s binaries for the lab tests (make k8s)"
  make -s k8s
  # Real lab nodes (internal/lab/runtime/containerd's root test): containerd,
  # its shim, ctr, runc and crictl (make node), the kubelet, and agnhost and
  # CoreDNS for the e2e images (internal/lab/images' root test).
  echo "== real-node binaries (make node, hack/build-k8s.sh kubelet agnhost, hack/build-coredns.sh)"
  make -s node
  hack/build-k8s.sh kubelet agnhost
  hack/build-coredns.sh
  # Simulated nodes (test/e2e TestLabSimulatedNodes, lab up
  # --simulated-nodes): kwok, from the Go module proxy (make kwok).
  echo "== kwok for the simulated-node test (make kwok)"
  make -s kwok
fi
echo "== fuzz (short pass over every config parser)"
# A count, not a time: with a short time limit, gathering the baseline
# coverage of a large seed corpus on a loaded machine can outlast it and
# the run fails with "context deadline exceeded".
FUZZTIME=${FUZZTIME:-5000x} hack/fuzz.sh
echo "== go test"
# -p 1: root tests share the kernel's tables; packages run one at a time.
# But test/e2e (the lab tests: about 16 minutes, most of it waiting on labs
# and timeouts, not CPU) runs beside the other packages (about 7): every
# test makes its namespaces, links, nft tables, labs and apiservers under
# names and ports of its own, as two labs side by side already do
# (TestLab/SecondLabSideBySide), and the root tests keep out of the
# ranges labs take in the host namespace (10.244.0.0/16, 10.250.0.0/16,
# 10.251.0.0/24; testutil.RequireFreeRange would refuse them while a lab
# runs). Both JSON streams go to one report as
# their events come; flags given to this script (GO_TEST_FLAGS) go to
# both. The run fails when either go test does (even with no JSON to
# show, e.g. a bad flag) or when the report saw a failure.
mod=$(go list -m)
mkfifo "$tmp/e2e.json" "$tmp/rest.json"
"$tmp/testreport" -trim "$mod/" "$tmp/e2e.json" "$tmp/rest.json" &
reporter=$!
go test -json -count=1 -timeout 30m "$@" ./test/e2e > "$tmp/e2e.json" &
e2e=$!
rc=0
# shellcheck disable=SC2046 # one package path per word
go test -json -count=1 -p 1 -timeout 20m "$@" $(go list ./... | grep -vx "$mod/test/e2e") > "$tmp/rest.json" || rc=$?
wait "$e2e" || rc=$?
wait "$reporter" || rc=$?
exit "$rc"
