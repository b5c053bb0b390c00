#!/usr/bin/env bash
# bench-gateway: flatnet's gateway data plane (internal/gateway/proxy)
# against nginx (Debian) configured as the equivalent reverse proxy, to the
# same echo backends (docs/benchmarks.md, "Gateway").
#
# Three network namespaces of this run, joined by veth pairs created inside
# them (nothing is added to the machine's own namespace):
#   cli (wrk) 10.123.1.2 -- 10.123.1.1 gw (the proxy measured)
#   gw 10.123.2.1 -- 10.123.2.2 be (nginx answering a 1 KiB body on
#   ports 8080-8082: three endpoints of one Service)
# The proxy measured runs alone on core 0 (taskset, so Go's GOMAXPROCS is
# 1 and nginx has one worker); wrk and the backends share core 1. Both
# proxies hold the same ROUTES HTTPRoutes (hostname r<i>.bench.example,
# PathPrefix "/", the three endpoints round robin): flatnet's as a
# routing table test/bench/gateway builds directly (no controller),
# nginx's as one server block per hostname with an upstream keepalive pool.
# The load goes to the middle hostname. Per proxy and mode (keep-alive:
# CONNS connections; new connections: CLOSE_CONNS connections sending
# "Connection: close", so one request per connection): a warm-up, then
# RUNS runs of DURATION seconds; the median run's requests/s and p99
# (wrk's own latency histogram), the proxy's CPU use and requests per
# CPU-second of it (the figure that holds when the machine is shared and
# the proxy is not the bottleneck), and its memory (PSS, see mem_kib) at
# rest with the table loaded and after the runs.
#
# Route change -> served: `gwbench change` measures the data plane's share
# (build the table of N routes plus one, Update, probe the new hostname
# until it answers) at 100 and ROUTES routes. The controller's share
# (watch, compile, status) is measured with the whole `flatnet gateway` in
# the lab: ROUTE_CHANGE_HOOK, when set, is a command run at the end with
# GW_BENCH_ROUTES="100 $ROUTES" in its environment; its output goes into
# the results.
#
# Needs root (network namespaces), Go; installs nginx and wrk (Debian) if
# missing. Runs under flock /tmp/flatnet-e2e.lock, so never beside a lab
# test or another bench. Namespaces, processes (by PID) and temp files are
# removed at the end, also on failure or Ctrl-C.
#
#   ROUTES       HTTPRoutes in both proxies (default 10000)
#   DURATION     seconds per measured run (default 10)
#   RUNS         measured runs per proxy and mode (default 3)
#   WARMUP       seconds of load before each mode's runs (default 3)
#   CONNS        wrk connections with keep-alive (default 64)
#   CLOSE_CONNS  wrk connections with Connection: close (default 16)
#   CHANGES      route changes per table size (default 100; 0 skips)
#   PROXIES      which proxies (default "nginx flatnet")
#   PROFILE      write a CPU profile of flatnet's proxy over all its runs
#                here (go tool pprof -top PROFILE)
#   NICE         niceness of the proxies, wrk and the backends (default -10:
#                ahead of builds on a shared machine; 0 to run as is)
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/go/bin:$PATH
if [ -z "${BENCH_GATEWAY_LOCKED:-}" ]; then
  exec env BENCH_GATEWAY_LOCKED=1 flock /tmp/flatnet-e2e.lock "$0" "$@"
fi
[ "$(id -u)" = 0 ] || { echo "bench-gateway: needs root (network namespaces)" >&2; exit 1; }
[ "$(nproc)" -ge 2 ] || { echo "bench-gateway: needs 2 cores (proxy on core 0, wrk and backends on core 1)" >&2; exit 1; }
routes=${ROUTES:-10000} duration=${DURATION:-10} runs=${RUNS:-3} warmup=${WARMUP:-3}
conns=${CONNS:-64} close_conns=${CLOSE_CONNS:-16} changes=${CHANGES:-100}
proxies=${PROXIES:-nginx flatnet} nice=${NICE:--10}

missing=()
command -v nginx >/dev/null || missing+=(nginx)
command -v wrk >/dev/null || missing+=(wrk)
if [ ${#missing[@]} -gt 0 ]; then
  echo "bench-gateway: installing ${missing[*]} (Debian packages)"
  export DEBIAN_FRONTEND=noninteractive
  apt-get install -y -qq "${missing[@]}" >/dev/null 2>&1 ||
    { apt-get update -qq && apt-get install -y -qq "${missing[@]}" >/dev/null; }
fi

root=$(mktemp -d /tmp/flatnet-bench-gateway.XXXXXX)
pfx=fgw$(od -An -N2 -tx2 /dev/urandom | tr -d ' ')
cli=$pfx-cli gw=$pfx-gw be=$pfx-be
nets=()     # namespaces created, deleted on exit
started=()  # PIDs of every process this script started, killed by PID on exit
current=    # the foreground one (wrk), waited for so Ctrl-C reaches cleanup at once
cleanup() {
  local rc=$?
  set +e
  local p n
  for p in $current "${started[@]}"; do kill "$p" 2>/dev/null; done
  for p in $current "${started[@]}"; do
    for _ in $(seq 50); do kill -0 "$p" 2>/dev/null || break; sleep 0.1; done
    kill -9 "$p" 2>/dev/null
  done
  for n in "${nets[@]}"; do ip netns del "$n"; done
  if [ "$rc" != 0 ]; then
    for f in "$root"/*.log "$root"/*/error.log; do [ -s "$f" ] && { echo "--- $f (last 20 lines)"; tail -n 20 "$f"; } >&2; done
  fi
  rm -rf "$root"
  exit $rc
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

fg() {
  "$@" &
  current=$!
  local rc=0
  wait "$current" || rc=$?
  current=
  return $rc
}

# nsx NS CMD...: CMD in NS, in the foreground. (What runs in the
# background is started with ip netns exec itself, which execs CMD, so
# that $! is CMD's PID.)
nsx() { local ns=$1; shift; ip netns exec "$ns" "$@"; }

for n in "$cli" "$gw" "$be"; do
  ip netns add "$n"
  nets+=("$n")
  nsx "$n" ip link set lo up
done
ip link add "${pfx}c" netns "$cli" type veth peer name "${pfx}g0" netns "$gw"
ip link add "${pfx}g1" netns "$gw" type veth peer name "${pfx}b" netns "$be"
nsx "$cli" ip addr add 10.123.1.2/24 dev "${pfx}c"
nsx "$gw" ip addr add 10.123.1.1/24 dev "${pfx}g0"
nsx "$gw" ip addr add 10.123.2.1/24 dev "${pfx}g1"
nsx "$be" ip addr add 10.123.2.2/24 dev "${pfx}b"
for l in "$cli ${pfx}c" "$gw ${pfx}g0" "$gw ${pfx}g1" "$be ${pfx}b"; do
  set -- $l
  nsx "$1" ip link set "$2" up
done
# New connections/s: the client's ports must not run out, nor the
# proxy's towards nothing (its upstream connections are pooled).
nsx "$cli" sysctl -qw net.ipv4.ip_local_port_range="1024 65000" net.ipv4.tcp_tw_reuse=1
nsx "$gw" sysctl -qw net.core.somaxconn=4096 net.ipv4.tcp_max_syn_backlog=4096

go build -o "$root/gwbench" ./test/bench/gateway
gwbench=$root/gwbench
listen=10.123.1.1:8080
backends=10.123.2.2:8080,10.123.2.2:8081,10.123.2.2:8082
host=r$((routes / 2)).bench.example

mkdir -p "$root/be"
"$gwbench" backend-conf -listen "$backends" -dir "$root/be" >"$root/be/nginx.conf"
ip netns exec "$be" nice -n "$nice" taskset -c 1 nginx -c "$root/be/nginx.conf" -p "$root/be" -e "$root/be/error.log" >"$root/be.log" 2>&1 &
started+=("$!")
for _ in $(seq 50); do
  [ "$(nsx "$gw" curl -s -o /dev/null -w '%{http_code}' http://10.123.2.2:8082/)" = 200 ] && break
  sleep 0.1
done

cat >"$root/report.lua" <<'EOF'
done = function(summary, latency, requests)
  local e = summary.errors
  io.write(string.format("RESULT requests=%d duration_us=%d errors=%d status_errors=%d p50_us=%d p99_us=%d\n",
    summary.requests, summary.duration, e.connect + e.read + e.write + e.timeout, e.status,
    latency:percentile(50), latency:percentile(99)))
end
EOF

echo "bench-gateway: $(date -u +%FT%TZ), $(nproc) cores, $(uname -r), $(go version | cut -d' ' -f3), $(nginx -v 2>&1 | cut -d' ' -f3), wrk $(dpkg-query -W -f '${Version}' wrk); $routes routes, load $(cut -d' ' -f1-3 /proc/loadavg)"

cputicks() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
# mem_kib PID: proportional set size (resident memory, pages shared
# between processes split among them) of PID and its children: nginx's
# master and worker share their configuration's pages after fork, which
# summed RSS would count twice. For one Go process PSS is its RSS.
mem_kib() {
  local t=0 p
  for p in "$1" $(pgrep -P "$1"); do
    t=$((t + $(awk '/^Pss:/ { print $2 }' "/proc/$p/smaps_rollup" 2>/dev/null || echo 0)))
  done
  echo "$t"
}
ticks_of() { # PID and its children
  local t=0 p
  for p in "$1" $(pgrep -P "$1"); do t=$((t + $(cputicks "$p" 2>/dev/null || echo 0))); done
  echo "$t"
}
hz=$(getconf CLK_TCK)

start_nginx() {
  mkdir -p "$root/nginx"
  "$gwbench" nginx-conf -listen "$listen" -routes "$routes" -backends "$backends" -dir "$root/nginx" >"$root/nginx/nginx.conf"
  ip netns exec "$gw" nice -n "$nice" taskset -c 0 nginx -c "$root/nginx/nginx.conf" -p "$root/nginx" -e "$root/nginx/error.log" >"$root/nginx.log" 2>&1 &
  server_pid=$!
}

start_flatnet() {
  ip netns exec "$gw" nice -n "$nice" taskset -c 0 "$gwbench" serve -listen "$listen" -routes "$routes" -backends "$backends" \
    ${PROFILE:+-cpuprofile "$PROFILE"} >"$root/flatnet.log" 2>&1 &
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

wait_ready() {
  local t0=$SECONDS
  until [ "$(nsx "$cli" curl -s -o /dev/null -w '%{http_code}' -H "Host: $host" "http://$listen/")" = 200 ]; do
    kill -0 "$server_pid" 2>/dev/null || { echo "bench-gateway: $1 exited" >&2; exit 1; }
    [ $((SECONDS - t0)) -lt 120 ] || { echo "bench-gateway: $1 not serving $host after 120 s" >&2; exit 1; }
    sleep 0.2
  done
  # A hostname no route has must be a 404 from both.
  local miss
  miss=$(nsx "$cli" curl -s -o /dev/null -w '%{http_code}' -H "Host: none.bench.example" "http://$listen/")
  [ "$miss" = 404 ] || { echo "bench-gateway: $1 answered $miss for an unknown host, want 404" >&2; exit 1; }
}

results=$root/results
: >"$results"
# wrk_run PROXY MODE RUN: one wrk run; appends a result line.
wrk_run() {
  local proxy=$1 mode=$2 run=$3 d=$4 c=$conns hdr=() before
  if [ "$mode" = close ]; then c=$close_conns hdr=(-H "Connection: close"); fi
  before=$(ticks_of "$server_pid")
  fg ip netns exec "$cli" nice -n "$nice" taskset -c 1 wrk -t1 -c"$c" -d"${d}s" --timeout 5s -H "Host: $host" "${hdr[@]}" \
    -s "$root/report.lua" "http://$listen/" >"$root/wrk.log" 2>&1
  [ "$run" = warmup ] && return 0
  local line
  line=$(grep '^RESULT' "$root/wrk.log") || exit 1
  echo "$proxy $mode $run $line cpu_ticks=$(($(ticks_of "$server_pid") - before))" >>"$results"
}

declare -A rest after
for proxy in $proxies; do
  "start_$proxy"
  started+=("$server_pid")
  wait_ready "$proxy"
  sleep 1
  rest[$proxy]=$(mem_kib "$server_pid")
  [ "$proxy" = flatnet ] && echo "bench-gateway: flatnet $(grep '^ready' "$root/flatnet.log")"
  echo "bench-gateway: $proxy serving $routes routes, $((rest[$proxy] / 1024)) MiB (PSS)"
  for mode in keepalive close; do
    wrk_run "$proxy" "$mode" warmup "$warmup"
    for r in $(seq "$runs"); do wrk_run "$proxy" "$mode" "$r" "$duration"; done
  done
  after[$proxy]=$(mem_kib "$server_pid")
  stop_server
done

echo
echo "Results: $routes routes, proxy alone on core 0; median of $runs × ${duration}s by requests/s; keep-alive $conns connections, new connections $close_conns (Connection: close)"
printf '%-8s %-10s %11s %8s %8s %7s %6s %12s %9s %9s\n' proxy mode "requests/s" "p50 ms" "p99 ms" errors "cpu %" "req/CPU-s" "rest MiB" "after MiB"
for proxy in $proxies; do
  for mode in keepalive close; do
    awk -v p="$proxy" -v m="$mode" -v hz="$hz" -v rest="${rest[$proxy]}" -v after="${after[$proxy]}" '
      $1 == p && $2 == m {
        for (i = 4; i <= NF; i++) { split($i, kv, "="); v[kv[1]] = kv[2] }
        n++; rps[n] = v["requests"] / (v["duration_us"] / 1e6)
        p50[n] = v["p50_us"] / 1000; p99[n] = v["p99_us"] / 1000
        err[n] = v["errors"] + v["status_errors"]; cpu[n] = 100 * v["cpu_ticks"] / hz / (v["duration_us"] / 1e6)
      }
      END {
        if (n == 0) exit
        for (i = 1; i <= n; i++) idx[i] = i
        for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (rps[idx[j]] < rps[idx[i]]) { t = idx[i]; idx[i] = idx[j]; idx[j] = t }
        k = idx[int((n + 1) / 2)]
        printf "%-8s %-10s %11.0f %8.2f %8.2f %7d %6.0f %12.0f %9.1f %9.1f\n", p, m, rps[k], p50[k], p99[k], err[k], cpu[k], (cpu[k] > 0 ? rps[k] / (cpu[k] / 100) : 0), rest / 1024, after / 1024
      }' "$results"
  done
done

if [ "$changes" -gt 0 ]; then
  echo
  echo "Route change -> served, data plane only (table build + Update + first 200 on the new hostname; probe in the same process, core 0):"
  fg ip netns exec "$gw" nice -n "$nice" taskset -c 0 "$gwbench" change -listen "$listen" -route-sizes "100,$routes" -changes "$changes" -backends "$backends"
fi
if [ -n "${ROUTE_CHANGE_HOOK:-}" ]; then
  echo
  echo "Route change -> served through the controller (ROUTE_CHANGE_HOOK):"
  GW_BENCH_ROUTES="100 $routes" fg bash -c "$ROUTE_CHANGE_HOOK"
fi
echo
echo "load at end $(cut -d' ' -f1-3 /proc/loadavg)"
