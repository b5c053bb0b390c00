#!/usr/bin/env bash
# bench-pods: a burst of pods started and stopped on one lab node, and the
# network's share of it (docs/benchmarks.md, "Burst start-up in the lab").
#
# Brings up a 1-node lab of its own (process runtime, its own state dir),
# then test/bench/pods switches it in turn to each set -- the flatnet
# conflist, the classic conflist (both flatnet-cni), the classic conflist
# with the reference plugins of containernetworking/plugins (hack/ref-cni.sh,
# through lab up --cni-bin-dir) -- and for each creates PODS pods at once,
# times create -> all Ready and delete -> all gone, and reads the runtime's
# own CNI ADD/DEL timings from the agent's metrics. The lab and every
# process started are removed at the end, also on failure or Ctrl-C. It
# starts a lab: take the machine's lab lock if others run labs
# (flock /tmp/flatnet-e2e.lock make bench-pods).
#
# Needs root and the upstream control plane (make k8s); the reference
# plugins are built through the Go module proxy the first time.
#
#   PODS      pods per burst (default 100; a node takes 110)
#   RUNS      runs of each set, sets alternating (default 3)
#   SETS      default flatnet,classic,classic-ref
#   JSON      also write the results here
#   LAB       lab name (default benchpods)
#   FLATNET   the flatnet binary (default bin/flatnet, built by make bench-pods)
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/go/bin:$PATH
[ "$(id -u)" = 0 ] || { echo "bench-pods: needs root (the lab)" >&2; exit 1; }
flatnet=$(realpath "${FLATNET:-bin/flatnet}")
[ -x "$flatnet" ] || { echo "bench-pods: $flatnet missing: run make build" >&2; exit 1; }
k8sbin=$(hack/build-k8s.sh --bin-dir)
for b in kube-apiserver kube-controller-manager kube-scheduler etcd; do
  [ -x "$k8sbin/$b" ] || { echo "bench-pods: $k8sbin/$b missing: run make k8s" >&2; exit 1; }
done
ref_dir=$(hack/ref-cni.sh)

root=$(mktemp -d /tmp/fbpods.XXXXXX)
name=${LAB:-benchpods}
bench_pid=
labup=
cleanup() {
  local rc=$?
  set +e
  if [ -n "$bench_pid" ] && kill -0 "$bench_pid" 2>/dev/null; then
    kill "$bench_pid"; wait "$bench_pid" 2>/dev/null
  fi
  if [ -n "$labup" ]; then
    "$flatnet" lab --state-dir "$root/labs" --name "$name" down >"$root/down.log" 2>&1 ||
      { echo "bench-pods: lab down $name failed:" >&2; cat "$root/down.log" >&2; rc=1; }
  fi
  # The net for what down left: only this lab's pod namespaces.
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^fl-${name}-" || true); do
    echo "bench-pods: removing leftover netns $ns" >&2
    ip netns delete "$ns" || true
  done
  rm -rf "$root"
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

go build -o "$root/podsbench" ./test/bench/pods
mkdir -p "$root/labs"
echo "bench-pods: $(date -u +%FT%TZ), $(nproc) cores, $(uname -r), $("$flatnet" version 2>/dev/null | head -1); load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "bench-pods: reference plugins $ref_dir"
labup=1
t0=$SECONDS
"$flatnet" lab --state-dir "$root/labs" --name "$name" up --nodes 1 --runtime process >"$root/up.log" 2>&1 ||
  { cat "$root/up.log" >&2; exit 1; }
echo "bench-pods: lab $name up in $((SECONDS - t0))s"

args=(-flatnet "$flatnet" -state-dir "$root/labs" -lab "$name" -ref "$ref_dir"
  -pods "${PODS:-100}" -runs "${RUNS:-3}" -sets "${SETS:-flatnet,classic,classic-ref}" -log "$root/switch.log")
[ -z "${JSON:-}" ] || args+=(-json "$JSON")
"$root/podsbench" "${args[@]}" "$@" &
bench_pid=$!
wait "$bench_pid" || { rc=$?; echo "bench-pods: failed; the agent's log ends:" >&2; tail -n 30 "$root/labs/$name/logs/agent-"*.log 2>/dev/null >&2; exit $rc; }
bench_pid=
echo
echo "bench-pods: load at end $(cut -d' ' -f1-3 /proc/loadavg)"
