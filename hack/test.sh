#!/usr/bin/env bash
# Runs every test tier: lint, unit tests, root tests in namespaces the tests
# create, and a short fuzz pass over every config parser.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/go/bin:$PATH
echo "== lint"
make -s lint
echo "== build"
make -s build
tmp=$(mktemp -d /tmp/flatnet-cni-path.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
make -s install-cni DESTDIR="$tmp" >/dev/null
export FLATNET_CNI_PATH=$tmp
if [ "$(id -u)" != 0 ]; then
  echo "== note: not root; root tests will skip (run as root to include them)"
else
  # The lab tests (test/e2e) run the upstream kube-apiserver and etcd:
  # build them into the cache (minutes the first time, a second after).
  echo "== k8s binaries for the lab tests (make k8s)"
  make -s k8s
fi
echo "== go test"
# -p 1: root tests share the kernel's tables; packages run one at a time.
go test -count=1 -p 1 -timeout 20m "$@" ./...
echo "== fuzz (short pass over every config parser)"
# A count, not a time: with a short time limit, gathering the baseline
# coverage of a large seed corpus on a loaded machine can outlast it and
# the run fails with "context deadline exceeded".
FUZZTIME=${FUZZTIME:-5000x} hack/fuzz.sh
