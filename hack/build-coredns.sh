#!/usr/bin/env bash
# build-coredns: upstream CoreDNS (the version test/bench/dns/coredns
# pins, with only the plugins its main.go imports) into the cache make k8s
# uses, static, -trimpath, stripped, like hack/bench-proxy.sh builds
# kube-proxy. Rebuilt only when the pin, the module's files or the Go
# version change (hack/cached-go-build.sh: a stamp beside build-k8s.sh's;
# one build at a time per cache). Users: hack/bench-dns.sh (the
# benchmark's server) and the lab's agnhost image (/coredns, which the DNS
# spec "should support configurable pod resolv.conf" runs).
# Prints nothing when the cached binary is current.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/go/bin:$PATH
mod=test/bench/dns/coredns
cv=$(awk '$1 == "require" && $2 == "github.com/coredns/coredns" { print $3; exit }' "$mod/go.mod")
[ -n "$cv" ] || { echo "build-coredns: $mod/go.mod does not require github.com/coredns/coredns" >&2; exit 1; }
want=$(printf 'binary=coredns\ncoredns=%s\ngo=%s\nmodsum=%s\n' "$cv" "$(go env GOVERSION)" \
  "$(cat "$mod/go.mod" "$mod/go.sum" "$mod/main.go" | sha256sum | cut -d' ' -f1)")
# The check: the binary says the version pinned.
exec hack/cached-go-build.sh coredns "$mod" . "$want" \
  sh -c '[ "$("$1" -version | head -1)" = "CoreDNS-${0#v}" ]' "$cv"
