#!/usr/bin/env bash
# bench-proxy: flatnet's Service proxy in each of its modes against
# upstream kube-proxy v1.37 in its nftables and iptables modes, in one run
# against one apiserver (docs/benchmarks.md, "Service proxy vs kube-proxy").
#
# Builds kube-proxy from the Go module proxy (the module pinned in
# test/bench/proxy/kubeproxy, into the cache make k8s uses; only here, never
# in CI), brings up a 1-node lab of its own, and runs test/bench/proxy: each
# proxy alone, at each size, in network namespaces of this run made fresh
# for it (the proxy's node on the lab's underlay, a pod-like client and an
# endpoint namespace whose server answers on every endpoint address):
# `kube-proxy --config` and `flatnet agent --proxy-only --config` with the
# same KubeProxyConfiguration but for mode; selector-less Services with
# EndpointSlices written directly, no pods. See test/bench/proxy/main.go for
# what is measured. The lab, the namespaces and every process started are
# removed at the end, also on failure or Ctrl-C; the lab's agent, paused
# during the run, is resumed.
#
# Needs root, the upstream binaries (make k8s), Go and the module proxy for
# the first kube-proxy build (a few minutes on 2 cores), iptables-nft.
#
#   SIZES     numbers of Services, ascending (default 1000,5000,10000)
#   MODES     proxies, any of kube-proxy-nftables,kube-proxy-iptables,
#             flatnet-nftables,flatnet-iptables,flatnet-userspace (default all);
#             a mode the binary refuses is reported "not available" and skipped
#   REPS      single endpoint changes per proxy and size (default 50)
#   BURST     endpoint changes in the burst, issued over 1 s (default 1000)
#   MIN_SYNC  min sync period, every proxy alike (default 1s)
#   ENDPOINTS endpoints per Service (default 3)
#   DP_DURATION, DP_MAX, DP_CONC  data path: longest run, most connections,
#             connections at a time (default 5s, 150000, 4)
#   TIMEOUT   longest wait for a proxy to program one step (default 5m)
#   NICE      niceness of the lab and the run (default -10: the machine's
#             other work, builds and tests, takes less from the figures)
#   LAB_DIR   parent of the lab's state, etcd's data included (default
#             /dev/shm: no fsync in every API write; the API's part of
#             "API → programmed" is the same for every proxy)
#   RESULTS   append the raw results (JSON lines) to this file
#   PROFILES  write each proxy's heap profile after its cold start to this
#             directory (enableProfiling: true for every proxy alike)
#   FLATNET   the flatnet binary measured and running the lab (default
#             bin/flatnet, which make bench-proxy builds from the work tree)
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/go/bin:$PATH
[ "$(id -u)" = 0 ] || { echo "bench-proxy: needs root (network namespaces, nftables)" >&2; exit 1; }
flatnet=$(realpath "${FLATNET:-bin/flatnet}")
[ -x "$flatnet" ] || { echo "bench-proxy: $flatnet missing: run make build" >&2; exit 1; }
hack/deps.sh >/dev/null

k8sbin=$(hack/build-k8s.sh --bin-dir)
for b in kube-apiserver etcd kubectl; do
  [ -x "$k8sbin/$b" ] || { echo "bench-proxy: $k8sbin/$b missing: run make k8s" >&2; exit 1; }
done

# kube-proxy, built like hack/build-k8s.sh builds the others (static,
# -trimpath, stripped, upstream's version variables), from a module of its
# own so that hack/k8s's go.sum, and with it make k8s's stamps, stay put.
build_kube_proxy() {
  local mod=test/bench/proxy/kubeproxy cache stamp want date flags p
  cache=$(dirname "$k8sbin")
  local kv v
  kv=$(awk '$1 == "require" { $1 = ""; $0 = $0 } $1 == "k8s.io/kubernetes" && $2 != "=>" { print $2; exit }' "$mod/go.mod")
  [ -n "$kv" ] && [[ $k8sbin == *"/k8s-$kv/bin" ]] ||
    { echo "bench-proxy: $mod pins kubernetes $kv, make k8s's cache is $k8sbin: keep them together" >&2; exit 1; }
  date=$(cd "$mod" && go list -m -f '{{if .Time}}{{.Time.UTC.Format "2006-01-02T15:04:05Z"}}{{end}}' k8s.io/kubernetes)
  v=${kv#v}
  flags="-s -w"
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    flags+=" -X $p.gitVersion=$kv -X $p.gitMajor=${v%%.*} -X $p.gitMinor=$(cut -d. -f2 <<<"$v") -X $p.buildDate=$date"
  done
  want=$(printf 'binary=kube-proxy\nkubernetes=%s\ngo=%s\nmodsum=%s\nldflags=%s\n' "$kv" "$(go env GOVERSION)" \
    "$(cat "$mod/go.mod" "$mod/go.sum" | sha256sum | cut -d' ' -f1)" "$flags")
  stamp=$cache/stamps/kube-proxy
  mkdir -p "$cache/stamps" "$cache/logs"
  exec 9>"$cache/.lock"
  flock 9 # one build at a time per cache (build-k8s.sh takes the same lock)
  if [ -x "$k8sbin/kube-proxy" ] && [ -f "$stamp" ] && [ "$want" = "$(cat "$stamp")" ]; then
    exec 9>&-
    return
  fi
  echo "bench-proxy: building kube-proxy $kv (static, -trimpath; minutes the first time); log $cache/logs/kube-proxy.log"
  local t0=$SECONDS
  if ! (cd "$mod" && CGO_ENABLED=0 nice -n 10 go build -trimpath -ldflags "$flags" -o "$k8sbin/kube-proxy.tmp" k8s.io/kubernetes/cmd/kube-proxy) \
    >"$cache/logs/kube-proxy.log" 2>&1; then
    tail -n 30 "$cache/logs/kube-proxy.log" >&2
    rm -f "$k8sbin/kube-proxy.tmp"
    exit 1
  fi
  "$k8sbin/kube-proxy.tmp" --version | grep -q "$kv\$" || { echo "bench-proxy: kube-proxy does not report $kv" >&2; exit 1; }
  mv -f "$k8sbin/kube-proxy.tmp" "$k8sbin/kube-proxy"
  echo "$want" >"$stamp"
  exec 9>&-
  echo "bench-proxy: kube-proxy built in $((SECONDS - t0))s"
}
build_kube_proxy

root=$(mktemp -d /tmp/flatnet-bench-proxy.XXXXXX)
labs=$(mktemp -d "${LAB_DIR:-/dev/shm}/flatnet-bench-proxy-lab.XXXXXX")
nice=${NICE:--10}
name=pb$$
prefix=pb$$
bench_pid=
labup=
cleanup() {
  local rc=$?
  set +e
  if [ -n "$bench_pid" ] && kill -0 "$bench_pid" 2>/dev/null; then
    kill "$bench_pid"; wait "$bench_pid" 2>/dev/null
  fi
  # Whatever the benchmark left if it was killed: its proxies by PID, the
  # lab agent it paused, its namespaces and veths by name.
  for f in "$root"/work/pids/*.pid; do [ -f "$f" ] && kill -9 "$(cat "$f")" 2>/dev/null; done
  for f in "$root"/work/pids/paused-*; do [ -f "$f" ] && kill -CONT "${f##*paused-}" 2>/dev/null; done
  ip link del "${prefix}n" 2>/dev/null
  for s in n c e; do ip netns del "$prefix-$s" 2>/dev/null; done
  if [ -n "$labup" ]; then
    "$flatnet" lab --state-dir "$labs" --name "$name" down >"$root/down.log" 2>&1 ||
      { echo "bench-proxy: lab down $name failed:" >&2; cat "$root/down.log" >&2; rc=1; }
  fi
  if [ -n "${RESULTS:-}" ] && [ -f "$root/results.jsonl" ]; then cat "$root/results.jsonl" >>"$RESULTS"; fi
  if [ "$rc" != 0 ] && [ -d "$root/work" ]; then
    for f in "$root"/work/*.log; do [ -f "$f" ] && { echo "--- $f (last 20 lines)"; tail -n 20 "$f"; } >&2; done
  fi
  rm -rf "$root" "$labs"
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

go build -o "$root/proxybench" ./test/bench/proxy
mkdir -p "$root/work"

echo "bench-proxy: $(date -u +%FT%TZ), $(nproc) cores, $(uname -r), $("$flatnet" version 2>/dev/null | head -1) ($flatnet), $("$k8sbin/kube-proxy" --version), $(nft --version | cut -d' ' -f1-2), $(iptables --version); commit $(git rev-parse --short HEAD 2>/dev/null)$(git diff --quiet HEAD 2>/dev/null || echo +dirty); load $(cut -d' ' -f1-3 /proc/loadavg)"
labup=1
nice -n "$nice" "$flatnet" lab --state-dir "$labs" --name "$name" up --nodes 1 >"$root/up.log" 2>&1 || { cat "$root/up.log" >&2; exit 1; }
echo "bench-proxy: lab $name up (state in $labs, nice $nice)"

nice -n "$nice" "$root/proxybench" run -state-dir "$labs" -lab "$name" -prefix "$prefix" \
  -kube-proxy "$k8sbin/kube-proxy" -flatnet "$flatnet" \
  -modes "${MODES:-kube-proxy-nftables,kube-proxy-iptables,flatnet-nftables,flatnet-iptables,flatnet-userspace}" \
  -sizes "${SIZES:-1000,5000,10000}" -reps "${REPS:-50}" -burst "${BURST:-1000}" -min-sync "${MIN_SYNC:-1s}" \
  -endpoints "${ENDPOINTS:-3}" -dp-duration "${DP_DURATION:-5s}" -dp-max "${DP_MAX:-150000}" -dp-conc "${DP_CONC:-4}" \
  -timeout "${TIMEOUT:-5m}" -dir "$root/work" -out "$root/results.jsonl" ${PROFILES:+-profiles "$(mkdir -p "$PROFILES" && realpath "$PROFILES")"} &
bench_pid=$!
wait "$bench_pid"
bench_pid=

echo
echo "Results (medians where repeated; ratios to kube-proxy's nftables mode, the data path's also to its iptables mode):"
"$root/proxybench" report -in "$root/results.jsonl"
echo
echo "load at end $(cut -d' ' -f1-3 /proc/loadavg)"
