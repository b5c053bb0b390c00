#!/usr/bin/env bash
# build-coredns: upstream CoreDNS (the version test/bench/dns/coredns
# pins, with only the plugins its main.go imports) into the cache make k8s
# uses, static, -trimpath, stripped, like hack/bench-proxy.sh builds
# kube-proxy. Rebuilt only when the pin, the module's files or the Go
# version change (a stamp beside build-k8s.sh's); one build at a time per
# cache (the lock build-k8s.sh takes). Users: hack/bench-dns.sh (the
# benchmark's server) and the lab's agnhost image (/coredns, which the DNS
# spec "should support configurable pod resolv.conf" runs).
# Prints nothing when the cached binary is current.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/go/bin:$PATH
k8sbin=$(hack/build-k8s.sh --bin-dir)
mod=test/bench/dns/coredns
cache=$(dirname "$k8sbin")
cv=$(awk '$1 == "require" && $2 == "github.com/coredns/coredns" { print $3; exit }' "$mod/go.mod")
[ -n "$cv" ] || { echo "build-coredns: $mod/go.mod does not require github.com/coredns/coredns" >&2; exit 1; }
want=$(printf 'binary=coredns\ncoredns=%s\ngo=%s\nmodsum=%s\n' "$cv" "$(go env GOVERSION)" \
  "$(cat "$mod/go.mod" "$mod/go.sum" "$mod/main.go" | sha256sum | cut -d' ' -f1)")
stamp=$cache/stamps/coredns
mkdir -p "$k8sbin" "$cache/stamps" "$cache/logs"
exec 9>"$cache/.lock"
flock 9
if [ -x "$k8sbin/coredns" ] && [ -f "$stamp" ] && [ "$want" = "$(cat "$stamp")" ]; then
  exit 0
fi
echo "build-coredns: building CoreDNS $cv (static, -trimpath; a minute or two the first time); log $cache/logs/coredns.log"
t0=$SECONDS
if ! (cd "$mod" && CGO_ENABLED=0 nice -n 10 go build -trimpath -ldflags "-s -w" -o "$k8sbin/coredns.tmp" .) \
  >"$cache/logs/coredns.log" 2>&1; then
  tail -n 30 "$cache/logs/coredns.log" >&2
  rm -f "$k8sbin/coredns.tmp"
  exit 1
fi
got=$("$k8sbin/coredns.tmp" -version | head -1)
[ "$got" = "CoreDNS-${cv#v}" ] || { echo "build-coredns: the coredns built says $got, not $cv" >&2; rm -f "$k8sbin/coredns.tmp"; exit 1; }
mv -f "$k8sbin/coredns.tmp" "$k8sbin/coredns"
echo "$want" >"$stamp"
echo "build-coredns: CoreDNS built in $((SECONDS - t0))s"
