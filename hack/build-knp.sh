#!/usr/bin/env bash
# build-knp: kube-network-policies (sigs.k8s.io/kube-network-policies, the
# reference NetworkPolicy enforcer, first packet of each flow to userspace
# over NFQUEUE), the anchor of make bench-policy, from the Go module proxy
# into a cache outside git:
#
#   ${FLATNET_CACHE:-$HOME/.cache/flatnet}/knp-<version>/bin/kube-network-policies
#
# Usage: hack/build-knp.sh [--bin-dir]   (--bin-dir: print the directory, build nothing)
#
# The version is pinned below. The build runs in a throwaway module of its
# own (a temp dir: go.mod requiring only kube-network-policies, go mod tidy),
# so every dependency is at the version kube-network-policies' own go.mod
# pins (MVS with one root) and nothing of flatnet's go.mod or hack/k8s's is
# touched; nothing of it lands in git. Static, -trimpath, stripped, niced.
# Rebuilt only when the stamp (version, Go version, this script) changes;
# one build at a time per cache (a second caller waits on the lock). The
# binary has no --version: `go version -m` must name the pinned module
# as the one its main package comes from.
set -euo pipefail
export PATH=/usr/local/go/bin:$PATH
export CGO_ENABLED=0

version=v0.8.0
module=sigs.k8s.io/kube-network-policies
cache=${FLATNET_CACHE:-$HOME/.cache/flatnet}/knp-$version
bin=$cache/bin
out=$bin/kube-network-policies

die() { echo "build-knp: $*" >&2; exit 1; }

if [ "${1-}" = "--bin-dir" ]; then
  echo "$bin"
  exit 0
fi
[ $# -eq 0 ] || die "unknown argument '$1' (usage: hack/build-knp.sh [--bin-dir])"
command -v go >/dev/null || die "no go in PATH or /usr/local/go/bin; install Go 1.23 or newer"

mkdir -p "$bin" "$cache/logs"
want=$(printf 'module=%s\nversion=%s\ngo=%s\nplatform=%s/%s\nrecipe=%s\n' "$module" "$version" \
  "$(go env GOVERSION)" "$(go env GOOS)" "$(go env GOARCH)" "$(sha256sum "${BASH_SOURCE[0]}" | cut -d' ' -f1)")
exec 9>"$cache/.lock"
flock 9
if [ -x "$out" ] && [ -f "$cache/stamp" ] && [ "$want" = "$(cat "$cache/stamp")" ]; then
  exit 0
fi

log=$cache/logs/build.log
tmp=$(mktemp -d /tmp/build-knp.XXXXXX)
trap 'rm -rf "$tmp"' EXIT
echo "build-knp: building $module $version (static, -trimpath; a few minutes the first time on 2 cores); log $log"
t0=$SECONDS
{
  cd "$tmp"
  go mod init flatnet.local/build-knp
  # A tools file, so that go mod tidy records every package the command needs.
  printf '//go:build tools\n\npackage tools\n\nimport _ "%s/cmd"\n' "$module" >tools.go
  go get "$module@$version"
  go mod tidy
  nice -n 10 go build -trimpath -ldflags "-s -w" -o "$out.tmp" "$module/cmd"
} >"$log" 2>&1 || { tail -n 30 "$log" >&2; rm -f "$out.tmp"; die "build failed (module proxy reachable? GOPROXY=$(go env GOPROXY))"; }
got=$(go version -m "$out.tmp" | awk -v m="$module" '$1 == "mod" && $2 == m { print $3 }')
[ "$got" = "$version" ] || { rm -f "$out.tmp"; die "the binary built carries $module ${got:-nothing}, not $version"; }
mv -f "$out.tmp" "$out"
echo "$want" >"$cache/stamp"
echo "build-knp: built in $((SECONDS - t0))s: $out"
