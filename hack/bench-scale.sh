#!/usr/bin/env bash
# bench-scale: flatnet's control plane and agent at cluster scale (issue
# 16; docs/scale.md): a lab with real node(s) and N simulated nodes (kwok
# plays their kubelet against the real kube-apiserver), Services and pods
# spread over namespaces as ClusterLoader2 spreads them, then churn; one
# JSON result and a Markdown table with every target checked
# (test/bench/scale says how each number is measured).
#
#   SIZE      small (500 nodes, 5,000 pods, 500 Services: about four
#             minutes), full (5,000 nodes, 100,000 pods, 10,000 Services:
#             an hour or more on two CPUs and ~6 GiB for the apiserver) or
#             ci (100 nodes, 1,000 pods, 100 Services, a 100-pod burst:
#             what .ci/run runs, every phase in about three minutes;
#             its figures are not the targets' sizes)
#   NODES, PODS, SERVICES, BURST   override the size's counts
#   BACKEND   host-gw (default) or vxlan
#   REAL      real lab nodes (default 1)
#   RESULTS   write the JSON result here (default: a temp file, printed)
#   TIMEOUT   the whole run (default 60m); phases done by then are reported
#   LAB       lab name (default scale); the lab is taken down at the end,
#             also on failure, unless KEEP=1
#
# Needs root, the upstream binaries (make k8s) and kwok (make kwok).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/go/bin:$PATH
[ "$(id -u)" = 0 ] || { echo "bench-scale: needs root (the lab)" >&2; exit 1; }
size=${SIZE:-small}
case $size in
  ci) nodes=100 pods=1000 services=100 burst=100 churn=10s ;;
  small) nodes=500 pods=5000 services=500 burst=500 churn=20s ;;
  full) nodes=5000 pods=100000 services=10000 burst=500 churn=60s ;;
  *) echo "bench-scale: SIZE=$size: want ci, small or full" >&2; exit 1 ;;
esac
nodes=${NODES:-$nodes} pods=${PODS:-$pods} services=${SERVICES:-$services} burst=${BURST:-$burst}
name=${LAB:-scale}
make -s build
make -s kwok
work=$(mktemp -d /tmp/flatnet-bench-scale.XXXXXX)
go build -o "$work/scalebench" ./test/bench/scale
results=${RESULTS:-$work/result.json}
cleanup() {
  if [ "${KEEP:-0}" != 1 ]; then bin/flatnet lab --name "$name" down >/dev/null 2>&1 || true; fi
  rm -rf "$work"
}
trap cleanup EXIT
trap 'exit 130' INT TERM
rc=0
"$work/scalebench" -flatnet bin/flatnet -lab "$name" -real-nodes "${REAL:-1}" -backend "${BACKEND:-host-gw}" \
  -nodes "$nodes" -pods "$pods" -services "$services" -burst "$burst" -churn-for "$churn" -timeout "${TIMEOUT:-60m}" -out "$results" || rc=$?
echo "bench-scale: result in $results"
[ "$results" != "$work/result.json" ] || cat "$results"
exit $rc
