#!/usr/bin/env bash
# bench-overlay: pod-to-pod TCP throughput (iperf3) and request/response
# latency (test/bench/overlay's ping-pong, p50/p99 RTT) across two nodes,
# for each cross-node backend, with node-to-node over the underlay as the
# baseline, side by side in one run (docs/benchmarks.md, Overlay).
#
# One 2-node lab per backend, all up at once; in each, a server pod on node 2
# (iperf3 -s and `overlaybench serve`) and a client pod on node 1. The
# baseline runs the same servers and clients in the node namespaces of the
# first lab, InternalIP to InternalIP. Each repetition measures every target
# once (throughput, then latency), starting at a different target each time,
# so load from anything else on the machine falls on all of them. Traffic
# stays inside the labs' namespaces and underlay bridges. Every lab is taken
# down at the end, also on failure or Ctrl-C.
#
# Needs root, bin/flatnet (make build), the upstream binaries (make k8s),
# iperf3 (hack/deps.sh).
#
#   BACKENDS  backends to measure (default: host-gw vxlan vxlan-direct, those
#             this flatnet supports; naming an unsupported one is an error)
#   REPS      repetitions (default 3)
#   DURATION  seconds per measurement (default 5)
#   RR_SIZE   request = response size in bytes for the latency test (default 64)
#   RESULTS   keep the raw results (JSON lines) at this path
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/go/bin:$PATH
[ "$(id -u)" = 0 ] || { echo "bench-overlay: needs root (labs are network namespaces)" >&2; exit 1; }
[ -x bin/flatnet ] || { echo "bench-overlay: bin/flatnet missing: run make build" >&2; exit 1; }
hack/deps.sh

reps=${REPS:-3}
dur=${DURATION:-5}
rr_size=${RR_SIZE:-64}
[[ $reps =~ ^[1-9][0-9]*$ && $dur =~ ^[1-9][0-9]*$ && $rr_size =~ ^[1-9][0-9]*$ ]] ||
  { echo "bench-overlay: REPS, DURATION and RR_SIZE are positive integers" >&2; exit 1; }

# The backends this flatnet's lab accepts, from `lab up --help`.
supported=$(bin/flatnet lab up --help 2>&1 | sed -n 's/.*cross-node backend: \([^(]*\).*/\1/p' | tr -d ',' | xargs)
if [ -n "${BACKENDS:-}" ]; then
  backends=($BACKENDS)
  for b in "${backends[@]}"; do
    [[ " $supported " == *" $b "* ]] || { echo "bench-overlay: backend $b: this flatnet supports: $supported" >&2; exit 1; }
  done
else
  backends=()
  for b in host-gw vxlan vxlan-direct; do
    if [[ " $supported " == *" $b "* ]]; then backends+=("$b"); else echo "bench-overlay: skipping $b: not supported by this flatnet ($supported)"; fi
  done
fi
[ ${#backends[@]} -gt 0 ] || { echo "bench-overlay: no backend to measure" >&2; exit 1; }

root=$(mktemp -d /tmp/flatnet-bench-overlay.XXXXXX)
chmod 755 "$root" # the pods run $root/overlaybench
labs=()
pids=()
cleanup() {
  local rc=$?
  set +e
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null; wait "$p" 2>/dev/null; done
  for l in "${labs[@]}"; do
    bin/flatnet lab --state-dir "$root" --name "$l" down >"$root/down-$l.log" 2>&1 ||
      { echo "bench-overlay: lab down $l failed:" >&2; cat "$root/down-$l.log" >&2; rc=1; }
  done
  if [ -n "${RESULTS:-}" ] && [ -f "$root/results.jsonl" ]; then cp "$root/results.jsonl" "$RESULTS"; fi
  rm -rf "$root"
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

ob=$root/overlaybench
go build -o "$ob" ./test/bench/overlay
res=$root/results.jsonl
: >"$res"

lab() { local l=$1; shift; bin/flatnet lab --state-dir "$root" --name "$l" "$@"; }
log() { echo "bench-overlay: $*"; }

echo "bench-overlay: $(date -u +%FT%TZ), $(nproc) cores, $(uname -r), flatnet $(git describe --tags --always --dirty 2>/dev/null || echo dev), load $(cut -d' ' -f1-3 /proc/loadavg)"
echo "bench-overlay: backends: ${backends[*]}; $reps reps of ${dur}s per measurement; request/response $rr_size bytes"

# One lab per backend: short names, so interface names stay readable.
declare -A labof podip
for b in "${backends[@]}"; do
  l=ov$$-$(echo "$b" | sed -e 's/host-gw/hg/' -e 's/vxlan-direct/vd/' -e 's/vxlan/vx/')
  labof[$b]=$l
  labs+=("$l")
  log "lab up $l (--backend $b)"
  lab "$l" up --nodes 2 --backend "$b" >"$root/up-$l.log" 2>&1 || { cat "$root/up-$l.log" >&2; exit 1; }
  sed -e "s|@NODE1@|$l-node1|" -e "s|@NODE2@|$l-node2|" -e "s|@OB@|$ob|" <<'EOF' | lab "$l" kubectl -- apply -f - >/dev/null
# No readiness probes: a probe would hit the servers while they are measured.
apiVersion: v1
kind: Pod
metadata: {name: bench-server}
spec:
  nodeName: @NODE2@
  terminationGracePeriodSeconds: 1
  containers:
  - name: iperf3
    image: debian # unused: the lab runs the host's programs
    command: ["iperf3", "-s", "-p", "5201"]
  - name: rr
    image: debian
    command: ["@OB@", "serve", "-listen", ":7000"]
---
apiVersion: v1
kind: Pod
metadata: {name: bench-client}
spec:
  nodeName: @NODE1@
  terminationGracePeriodSeconds: 1
  containers:
  - name: idle
    image: debian
    command: ["sleep", "infinity"]
EOF
done

# Pod IPs, and each server reachable from its client (a short unmeasured
# iperf3 and ping-pong, which also warm the path).
iperf_to() { # where target host -- iperf3 client args
  local where=$1 target=$2 host=$3; shift 3
  case $where in
    baseline) ip netns exec "fl-${labof[${backends[0]}]}-n1" iperf3 -c "$host" -p 5201 "$@" </dev/null ;;
    *) lab "${labof[$target]}" exec bench-client -- iperf3 -c "$host" -p 5201 "$@" </dev/null ;;
  esac
}
ping_to() { # where target host -- overlaybench ping args
  local where=$1 target=$2 host=$3; shift 3
  case $where in
    baseline) ip netns exec "fl-${labof[${backends[0]}]}-n1" "$ob" ping -to "$host:7000" -target "$target" "$@" </dev/null ;;
    *) lab "${labof[$target]}" exec bench-client -- "$ob" ping -to "$host:7000" -target "$target" "$@" </dev/null ;;
  esac
}
ready() { # where target host
  iperf_to "$@" -t 1 -J >"$root/warm.json" 2>&1 && "$ob" iperf3 -target warm <"$root/warm.json" >/dev/null 2>&1 &&
    ping_to "$@" -duration 200ms -warmup 0 >/dev/null 2>&1
}
wait_ready() {
  local deadline=$(($(date +%s) + 60))
  until ready "$@"; do
    if [ "$(date +%s)" -ge "$deadline" ]; then
      echo "bench-overlay: $2: server at $3 not reachable after 60s; last iperf3 output:" >&2
      cat "$root/warm.json" >&2
      return 1
    fi
    sleep 0.5
  done
}
# `ip link` names link-netnsids by asking every netns in /run/netns; stale ones
# (other test runs) print kernel errors that say nothing about this lab.
mtu_of() { sed -n 's/.* mtu \([0-9]*\) .*/\1/p' | head -1; }

for b in "${backends[@]}"; do
  l=${labof[$b]}
  lab "$l" kubectl -- wait --for=jsonpath='{.status.podIP}' pod/bench-server pod/bench-client --timeout=60s >/dev/null
  podip[$b]=$(lab "$l" kubectl -- get pod bench-server -o jsonpath='{.status.podIP}')
  wait_ready pod "$b" "${podip[$b]}"
  mtu=$(lab "$l" exec bench-client -- ip -o link show eth0 2>/dev/null </dev/null | mtu_of)
  case $b in
    host-gw) path="pod to pod, routed via the peer node's InternalIP" ;;
    vxlan) path="pod to pod, VXLAN" ;;
    vxlan-direct) path="pod to pod, vxlan with direct routing, nodes on one subnet" ;;
    *) path="pod to pod" ;;
  esac
  # The path measured is the one named: through the VXLAN device for vxlan
  # only (vxlan-direct routes a peer on its own subnet directly).
  route=$(ip netns exec "fl-$l-n1" ip -o route get "${podip[$b]}" | head -1)
  case $b:$route in
    vxlan:*" dev flatnet."* | host-gw:* | vxlan-direct:*) ;;
    *) echo "bench-overlay: $b: node 1 does not route ${podip[$b]} through the VXLAN device: $route" >&2; exit 1 ;;
  esac
  if [ "$b" != vxlan ] && [[ $route == *" dev flatnet."* ]]; then
    echo "bench-overlay: $b: node 1 routes ${podip[$b]} through the VXLAN device: $route" >&2; exit 1
  fi
  "$ob" info -target "$b" -mtu "${mtu:-0}" -path "$path" >>"$res"
  log "$b: lab ${labof[$b]}, server pod ${podip[$b]} on node 2, client pod on node 1, pod MTU ${mtu:-?}; node 1: $(echo "$route" | sed 's/ *\\ */ /g; s/  */ /g')"
done

# Baseline: node 1 to node 2 of the first lab, InternalIP to InternalIP.
bl=${labof[${backends[0]}]}
n2=$(lab "$bl" kubectl -- get node "$bl-node2" -o jsonpath='{.status.addresses[?(@.type=="InternalIP")].address}')
ip netns exec "fl-$bl-n2" iperf3 -s -B "$n2" -p 5201 >"$root/baseline-iperf3.log" 2>&1 &
pids+=($!)
ip netns exec "fl-$bl-n2" "$ob" serve -listen "$n2:7000" >"$root/baseline-rr.log" 2>&1 &
pids+=($!)
wait_ready baseline baseline "$n2"
mtu=$(ip netns exec "fl-$bl-n1" ip -o link show eth0 2>/dev/null | mtu_of)
"$ob" info -target baseline -mtu "${mtu:-0}" -path "node to node over the underlay" >>"$res"
log "baseline: lab $bl, node 1 to node 2 ($n2), MTU ${mtu:-?}"

targets=(baseline "${backends[@]}")
hosts=("$n2")
for b in "${backends[@]}"; do hosts+=("${podip[$b]}"); done
nt=${#targets[@]}
for rep in $(seq 1 "$reps"); do
  for k in $(seq 0 $((nt - 1))); do
    i=$(((k + rep - 1) % nt)) # rotate the order from one rep to the next
    t=${targets[$i]} h=${hosts[$i]} where=pod
    [ "$t" = baseline ] && where=baseline
    iperf_to "$where" "$t" "$h" -t "$dur" -J >"$root/iperf.json" 2>&1 || true
    "$ob" iperf3 -target "$t" -rep "$rep" <"$root/iperf.json" >>"$res" ||
      { echo "bench-overlay: iperf3 to $t ($h) failed" >&2; exit 1; }
    ping_to "$where" "$t" "$h" -rep "$rep" -size "$rr_size" -duration "${dur}s" >>"$res" ||
      { echo "bench-overlay: ping-pong to $t ($h) failed" >&2; exit 1; }
    log "rep $rep: $t done"
  done
done

echo
echo "Results (median over $reps reps; ratios are path/baseline; TCP: iperf3 -t $dur, one stream, client -> server;"
echo "RR: one connection, $rr_size-byte request and answer, ${dur}s, p50/p99 of each run, median over reps):"
echo
"$ob" report -reps "$res"
echo
echo "load at end $(cut -d' ' -f1-3 /proc/loadavg)"
