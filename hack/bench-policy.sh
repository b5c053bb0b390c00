#!/usr/bin/env bash
# bench-policy: NetworkPolicy enforcement, flatnet (`flatnet agent
# --network-policy`) against sigs.k8s.io/kube-network-policies v0.8.0, in
# one run on one lab (docs/benchmarks.md, "NetworkPolicy").
#
# Builds kube-network-policies (hack/build-knp.sh, cached), brings up a lab
# of its own (process runtime, NODES nodes) and runs test/bench/policy: the
# workload (NAMESPACES, PODS, POLICIES) in the lab's API, then each enforcer
# in turn on node 2 (see test/bench/policy/main.go for what is measured and
# why they take turns). The lab and every process started are removed at
# the end, also on failure or Ctrl-C. Run it alone: it starts a lab, so
# take the machine's lab lock if others run labs
# (flock /tmp/flatnet-e2e.lock make bench-policy).
#
# Needs root, the upstream control plane (make k8s), Go and the module
# proxy for the first kube-network-policies build (about a minute).
#
#   NODES        lab nodes (default 3)
#   NAMESPACES   workload namespaces (default 100)
#   PODS         workload pods (default 500)
#   POLICIES     NetworkPolicies in all (default 1000)
#   SAMPLES      deny+allow cycles per enforcer (default 50)
#   RATE_RUNS    connection-rate runs per enforcer, 5 s each (default 3)
#   ENFORCERS    turns (default none,kube-network-policies,flatnet,none)
#   KEEP_LOGS    copy the lab's logs (agents, anchor, control plane) into this dir
#   RESULT       keep the JSON result at this path
#   FLATNET      the flatnet binary measured and running the lab (default
#                bin/flatnet, which make bench-policy builds)
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/go/bin:$PATH
[ "$(id -u)" = 0 ] || { echo "bench-policy: needs root (network namespaces, nftables)" >&2; exit 1; }
flatnet=$(realpath "${FLATNET:-bin/flatnet}")
[ -x "$flatnet" ] || { echo "bench-policy: $flatnet missing: run make build" >&2; exit 1; }
[ -r /proc/net/netfilter/nfnetlink_queue ] ||
  { echo "bench-policy: this kernel has no nfnetlink_queue (CONFIG_NETFILTER_NETLINK_QUEUE), which kube-network-policies needs" >&2; exit 1; }
hack/deps.sh >/dev/null
k8sbin=$(hack/build-k8s.sh --bin-dir)
for b in kube-apiserver etcd kubectl; do
  [ -x "$k8sbin/$b" ] || { echo "bench-policy: $k8sbin/$b missing: run make k8s" >&2; exit 1; }
done
hack/build-knp.sh
knp=$(hack/build-knp.sh --bin-dir)/kube-network-policies

root=$(mktemp -d /tmp/fbp.XXXXXX)
name=bp$$
bench_pid=
labup=
cleanup() {
  local rc=$?
  set +e
  if [ -n "$bench_pid" ] && kill -0 "$bench_pid" 2>/dev/null; then
    kill "$bench_pid"; wait "$bench_pid" 2>/dev/null
  fi
  if [ -n "${KEEP_LOGS:-}" ] && [ -d "$root/labs/$name/logs" ]; then
    mkdir -p "$KEEP_LOGS" && cp "$root/labs/$name/logs/"*.log "$KEEP_LOGS/"
  fi
  # lab down stops the anchor too: it is a daemon of the lab's state dir.
  if [ -n "$labup" ]; then
    "$flatnet" lab --state-dir "$root/labs" --name "$name" down >"$root/down.log" 2>&1 ||
      { echo "bench-policy: lab down $name failed:" >&2; cat "$root/down.log" >&2; rc=1; }
  fi
  if [ -n "${RESULT:-}" ] && [ -f "$root/result.json" ]; then cp "$root/result.json" "$RESULT"; fi
  rm -rf "$root"
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

go build -o "$root/policybench" ./test/bench/policy
mkdir -p "$root/work" "$root/labs"
echo "bench-policy: $(date -u +%FT%TZ), $(nproc) cores, $(uname -r), $("$flatnet" version 2>/dev/null | head -1); load $(cut -d' ' -f1-3 /proc/loadavg)"
labup=1
t0=$SECONDS
"$flatnet" lab --state-dir "$root/labs" --name "$name" up --nodes "${NODES:-3}" >"$root/up.log" 2>&1 || { cat "$root/up.log" >&2; exit 1; }
echo "bench-policy: lab $name up in $((SECONDS - t0))s"

"$root/policybench" run -state-dir "$root/labs" -lab "$name" -knp "$knp" -flatnet "$flatnet" \
  -namespaces "${NAMESPACES:-100}" -pods "${PODS:-500}" -policies "${POLICIES:-1000}" \
  -samples "${SAMPLES:-50}" -rate-runs "${RATE_RUNS:-3}" \
  -enforcers "${ENFORCERS:-none,kube-network-policies,flatnet,none}" \
  -dir "$root/work" -out "$root/result.json" &
bench_pid=$!
wait "$bench_pid" || { rc=$?; tail -n 30 "$root/labs/$name/logs/bench-kube-network-policies.log" 2>/dev/null >&2; exit $rc; }
bench_pid=
echo
echo "load at end $(cut -d' ' -f1-3 /proc/loadavg)"
