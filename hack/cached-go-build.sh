#!/usr/bin/env bash
# cached-go-build NAME MODDIR PKG STAMP [CHECK...]: builds Go package PKG of
# the module in MODDIR (static, -trimpath, stripped) into the cache make k8s
# uses as <hack/build-k8s.sh --bin-dir>/NAME, unless the binary is there and
# its stamp file holds STAMP (what the build depends on: versions, go.sum,
# the Go version). CHECK, when given, runs with the new binary's path as its
# last argument and must succeed before the binary replaces the old one.
# One build at a time per cache (the lock build-k8s.sh takes). Prints
# nothing when the cached binary is current. Users: hack/build-coredns.sh,
# hack/build-echo-basic.sh.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/go/bin:$PATH
[ $# -ge 4 ] || { echo "usage: $0 NAME MODDIR PKG STAMP [CHECK...]" >&2; exit 2; }
name=$1 mod=$2 pkg=$3 want=$4
shift 4
k8sbin=$(hack/build-k8s.sh --bin-dir)
cache=$(dirname "$k8sbin")
stamp=$cache/stamps/$name
mkdir -p "$k8sbin" "$cache/stamps" "$cache/logs"
exec 9>"$cache/.lock"
flock 9
if [ -x "$k8sbin/$name" ] && [ -f "$stamp" ] && [ "$want" = "$(cat "$stamp")" ]; then
  exit 0
fi
log=$cache/logs/$name.log
echo "$name: building $pkg in $mod (static, -trimpath; minutes the first time); log $log"
t0=$SECONDS
if ! (cd "$mod" && CGO_ENABLED=0 nice -n 10 go build -trimpath -ldflags "-s -w" -o "$k8sbin/$name.tmp" "$pkg") >"$log" 2>&1; then
  tail -n 30 "$log" >&2
  rm -f "$k8sbin/$name.tmp"
  exit 1
fi
if [ $# -gt 0 ] && ! "$@" "$k8sbin/$name.tmp"; then
  echo "$name: the binary built fails its check ($*)" >&2
  rm -f "$k8sbin/$name.tmp"
  exit 1
fi
mv -f "$k8sbin/$name.tmp" "$k8sbin/$name"
echo "$want" >"$stamp"
echo "$name: built in $((SECONDS - t0))s"
