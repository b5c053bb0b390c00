#!/usr/bin/env bash
# bench-dns: flatnet's cluster DNS against upstream CoreDNS with its
# kubernetes plugin, in one run against one apiserver holding 10,000
# Services (docs/benchmarks.md, "Cluster DNS vs CoreDNS"; the method is the
# CoreDNS anchor's, docs/research/coredns-anchor.md in shared/).
#
# Installs dnsperf (Debian) if missing; builds CoreDNS from the Go module
# proxy if needed (hack/build-coredns.sh: the module pinned in
# test/bench/dns/coredns, into the cache make k8s uses); brings up a 1-node lab of its own and
# creates 100 namespaces × 100 ClusterIP Services with test/bench/dns
# (which also writes the query files, checks each server's answers before
# measuring it and parses dnsperf's output). Then, one server at a time,
# each alone on core 0 (taskset -c 0, so GOMAXPROCS=1), dnsperf on core 1
# with the lab's daemons and the upstream: CoreDNS and flatnet, then each
# again with autopath on. Per case: 3 closed-loop runs (-q 100) after a
# warm-up, QPS (median), p50/p99 from dnsperf -v's per-query lines, the
# server's CPU and resident memory. Everything listens on 127.0.0.1 only.
# The lab, every process started (by PID) and the temp files are removed at
# the end, also on failure or Ctrl-C.
#
# Needs root, the upstream binaries (make k8s), Go and the module proxy for
# the first CoreDNS build (about a minute on 2 cores).
#
#   DURATION    seconds per measured run (default 15; the anchor's 20 makes
#               the run about 3 minutes longer)
#   RUNS        measured runs per case and server (default 3)
#   WARMUP      seconds of load before each case's runs (default 3)
#   SERVERS     which servers (default "coredns flatnet")
#   NAMESPACES  namespaces ns0.. (default 100)
#   SERVICES    Services per namespace (default 100)
#   RESULTS     keep the raw results (JSON lines) at this path
#   FLATNET     the flatnet binary measured and running the lab (default
#               bin/flatnet, which make bench-dns builds from the work tree)
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/go/bin:$PATH
[ "$(id -u)" = 0 ] || { echo "bench-dns: needs root (the lab, taskset on its daemons)" >&2; exit 1; }
flatnet=$(realpath "${FLATNET:-bin/flatnet}")
[ -x "$flatnet" ] || { echo "bench-dns: $flatnet missing: run make build" >&2; exit 1; }
[ "$(nproc)" -ge 2 ] || { echo "bench-dns: needs 2 cores (server on core 0, dnsperf on core 1)" >&2; exit 1; }
hack/deps.sh >/dev/null
duration=${DURATION:-15} runs=${RUNS:-3} warmup=${WARMUP:-3}
nss=${NAMESPACES:-100} svcs=${SERVICES:-100}
servers=${SERVERS:-coredns flatnet}

if ! command -v dnsperf >/dev/null; then
  echo "bench-dns: installing dnsperf (Debian package)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq dnsperf >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq dnsperf >/dev/null; }
fi

k8sbin=$(hack/build-k8s.sh --bin-dir)
for b in kube-apiserver etcd; do
  [ -x "$k8sbin/$b" ] || { echo "bench-dns: $k8sbin/$b missing: run make k8s" >&2; exit 1; }
done

# CoreDNS from the module test/bench/dns/coredns pins (cached).
hack/build-coredns.sh
coredns=$k8sbin/coredns

root=$(mktemp -d /tmp/flatnet-bench-dns.XXXXXX)
name=${LAB_NAME:-benchdns}
labup=
started=()  # PIDs of every process this script started, killed by PID on exit
paused=()   # the lab's agents, stopped during the run, resumed before lab down
current=    # the foreground one (dnsperf, dnsbench), waited for so Ctrl-C and TERM reach cleanup at once
cleanup() {
  local rc=$?
  set +e
  local p
  for p in $current "${started[@]}"; do kill "$p" 2>/dev/null; done
  for p in $current "${started[@]}"; do
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$p" 2>/dev/null
  done
  for p in "${paused[@]}"; do kill -CONT "$p" 2>/dev/null; done
  if [ -n "$labup" ]; then
    "$flatnet" lab --state-dir "$root/labs" --name "$name" down >"$root/down.log" 2>&1 ||
      { echo "bench-dns: lab down $name failed:" >&2; cat "$root/down.log" >&2; rc=1; }
  fi
  if [ -n "${RESULTS:-}" ] && [ -f "$root/results.jsonl" ]; then cp "$root/results.jsonl" "$RESULTS"; fi
  if [ "$rc" != 0 ]; then
    for f in "$root"/*.log; do [ -f "$f" ] && { echo "--- $f (last 20 lines)"; tail -n 20 "$f"; } >&2; done
  fi
  rm -rf "$root"
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# fg runs a command in the background and waits for it: a trap runs while
# waiting, and cleanup knows the PID.
fg() {
  "$@" &
  current=$!
  local rc=0
  wait "$current" || rc=$?
  current=
  return $rc
}

# Two free ports on 127.0.0.1, TCP and UDP: the upstream's and the
# measured server's.
port_free() { ! ss -Hlnptu "sport = :$1" | grep -q .; }
up_port=
for p in $(shuf -i 20000-59999 -n 50); do
  if port_free "$p" && port_free $((p + 1)); then up_port=$p; break; fi
done
[ -n "$up_port" ] || { echo "bench-dns: no two free ports on 127.0.0.1" >&2; exit 1; }
srv_port=$((up_port + 1))

go build -o "$root/dnsbench" ./test/bench/dns
dnsbench=$root/dnsbench
mkdir -p "$root/labs" "$root/queries"
"$dnsbench" queries -dir "$root/queries" -namespaces "$nss" -services "$svcs" >"$root/cases"

echo "bench-dns: $(date -u +%FT%TZ), $(nproc) cores, $(uname -r), $("$flatnet" version 2>/dev/null | head -1) ($flatnet), $("$coredns" -version | head -1), dnsperf $(dpkg-query -W -f '${Version}' dnsperf); load $(cut -d' ' -f1-3 /proc/loadavg)"
labup=1
"$flatnet" lab --state-dir "$root/labs" --name "$name" up --nodes 1 >"$root/up.log" 2>&1 || { cat "$root/up.log" >&2; exit 1; }
state=$root/labs/$name
kubeconfig=$state/admin.kubeconfig
[ -f "$kubeconfig" ] || { echo "bench-dns: no $kubeconfig after lab up" >&2; exit 1; }
# The lab's node agent is not measured and needs nothing here (no pod
# runs): it is paused (SIGSTOP, by the PID in its pid file; resumed before
# lab down) so that its Service proxy, re-syncing nftables while 10,000
# Services arrive, and its own informers take no CPU from the run.
for f in "$state"/pids/agent-*.pid; do
  p=$(head -1 "$f")
  [ -n "$p" ] && kill -STOP "$p" && paused+=("$p")
done
echo "bench-dns: lab $name up, its agent paused"
fg "$dnsbench" objects -kubeconfig "$kubeconfig" -namespaces "$nss" -services "$svcs" -workers 32
# Core 0 is the measured server's alone from here: the lab's daemons (only
# those, by the PIDs in its pid files) go to core 1 with dnsperf, as in the
# anchor. (Before the objects they would slow creating them down.)
for f in "$state"/pids/*.pid; do
  p=$(head -1 "$f")
  [ -n "$p" ] && taskset -a -cp 1 "$p" >/dev/null
done
echo "bench-dns: $(basename -a "$state"/pids/*.pid | sed 's/\.pid$//' | tr '\n' ' ')moved to core 1"

# The upstream for external names: CoreDNS answering every name under
# example.com from a template (A: 198.51.100.7, TEST-NET-2, never dialled;
# AAAA: no data), on core 1. Both measured servers forward to it and cache.
cat >"$root/Corefile.upstream" <<EOF
example.com:$up_port {
  bind 127.0.0.1
  template IN A example.com {
    answer "{{ .Name }} 3600 IN A 198.51.100.7"
  }
  template IN AAAA example.com {
    rcode NOERROR
  }
}
EOF
taskset -c 1 "$coredns" -conf "$root/Corefile.upstream" >"$root/upstream.log" 2>&1 &
upstream_pid=$!
started+=("$upstream_pid")

# CoreDNS as the anchor configured it, plus what the extra cases need:
# pods verified (autopath's source of the client's namespace; flatnet's
# default too), forward to the upstream, and autopath in its variant.
start_coredns() { # autopath: 0 or 1
  local ap=
  [ "$1" = 1 ] && ap="autopath @kubernetes"
  cat >"$root/Corefile" <<EOF
.:$srv_port {
  bind 127.0.0.1
  errors
  $ap
  kubernetes cluster.local in-addr.arpa ip6.arpa {
    kubeconfig $kubeconfig
    pods verified
    fallthrough in-addr.arpa ip6.arpa
  }
  cache 30
  loadbalance
  forward . 127.0.0.1:$up_port
}
EOF
  taskset -c 0 "$coredns" -conf "$root/Corefile" >"$root/server.log" 2>&1 &
  server_pid=$!
}

# flatnet's DNS server alone (--dns-only), on the same port, same upstream;
# no address taken on the machine (--dns-addresses=) and no metrics
# listener (the CoreDNS measured has no prometheus plugin either).
start_flatnet() { # autopath: 0 or 1
  local ap=()
  [ "$1" = 1 ] && ap=(--dns-autopath)
  taskset -c 0 "$flatnet" agent --dns-only --kubeconfig "$kubeconfig" --dns-addresses= \
    --dns-listen "127.0.0.1:$srv_port" --dns-upstreams "127.0.0.1:$up_port" "${ap[@]}" \
    --dns-metrics-bind-address= >"$root/server.log" 2>&1 &
  server_pid=$!
}

stop_server() {
  kill "$server_pid" 2>/dev/null || true
  for _ in $(seq 50); do kill -0 "$server_pid" 2>/dev/null || break; sleep 0.1; done
  kill -9 "$server_pid" 2>/dev/null || true
  wait "$server_pid" 2>/dev/null || true
  local keep=() p
  for p in "${started[@]}"; do [ "$p" = "$server_pid" ] || keep+=("$p"); done
  started=("${keep[@]}")
  server_pid=
}

cputicks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }

# measure SERVER AUTOPATH: start it, wait for its answers, run its cases.
measure() {
  local srv=$1 ap=$2 kind=base t cases c r before up_before
  [ "$ap" = 1 ] && kind=autopath
  mapfile -t cases < <(awk -v k="$kind" '$2 == k { print $1 }' "$root/cases")
  [ ${#cases[@]} -gt 0 ] || return 0
  "start_$srv" "$ap"
  started+=("$server_pid")
  local apflag=()
  [ "$ap" = 1 ] && apflag=(-autopath)
  fg taskset -c 1 "$dnsbench" ready -server "127.0.0.1:$srv_port" -namespaces "$nss" -services "$svcs" "${apflag[@]}" \
    >"$root/ready.out" || { cat "$root/server.log" >&2; exit 1; }
  t=$(cat "$root/ready.out")
  echo "bench-dns: $srv ($kind) answering after ${t}s, $(awk '/^VmRSS/ { printf "%.1f MiB", $2 / 1024 }' "/proc/$server_pid/status"), threads $(awk '/^Threads/ { print $2 }' "/proc/$server_pid/status")"
  for c in "${cases[@]}"; do
    local dp=(taskset -c 1 dnsperf -s 127.0.0.1 -p "$srv_port" -T 1 -c 1 -q 100 -d "$root/queries/$c.txt")
    fg "${dp[@]}" -l "$warmup" >/dev/null 2>&1
    for r in $(seq "$runs"); do
      before=$(cputicks "$server_pid") up_before=$(cputicks "$upstream_pid")
      fg "${dp[@]}" -l "$duration" -v >"$root/dnsperf.out" 2>&1
      fg "$dnsbench" parse -in "$root/dnsperf.out" -out "$root/results.jsonl" -case "$c" -server "$srv" -run "$r" \
        -pid "$server_pid" -cpu-ticks $(($(cputicks "$server_pid") - before)) \
        -upstream-cpu-ticks $(($(cputicks "$upstream_pid") - up_before))
      rm -f "$root/dnsperf.out"
    done
  done
  stop_server
}

for srv in $servers; do
  if [ "$srv" = flatnet ] && ! "$flatnet" agent --help 2>&1 | grep -q -- '--dns-only'; then
    echo "bench-dns: $flatnet agent has no --dns-only yet: flatnet's side not run"
    continue
  fi
  measure "$srv" 0
  measure "$srv" 1
done

echo
echo "Results (closed loop, 100 outstanding, median of $runs × ${duration}s; (×): flatnet's QPS over CoreDNS's):"
"$dnsbench" report -in "$root/results.jsonl"
echo
echo "load at end $(cut -d' ' -f1-3 /proc/loadavg)"
