#!/usr/bin/env bash
# build-kwok: kwok (sigs.k8s.io/kwok), which plays the kubelet for the lab's
# simulated nodes (flatnet lab up --simulated-nodes N), from the Go module
# proxy with the version and every dependency pinned in hack/kwok/go.mod and
# go.sum, into a cache outside git:
#
#   ${FLATNET_CACHE:-$HOME/.cache/flatnet}/kwok-<version>/bin/kwok
#
# Usage: hack/build-kwok.sh [--bin-dir]   (--bin-dir: print the directory, build nothing)
#
# Rebuilt only when the stamp (version, go.mod/go.sum hash, Go version, this
# script) changes, so a second run costs a second; one build at a time per
# cache (a second caller waits on the lock). Static, -trimpath, stripped,
# niced; about a minute on 2 cores the first time (v0.8.0 needs Go 1.26).
# The check: `kwok --version` names the pinned version. The lab finds the
# binary at this path (internal/lab/simnodes.KwokBinary); keep the two in step.
#
# One line of kwok is changed for the build (in a copy of its source under
# the cache, built through a go.mod that replaces the module with the copy;
# the module cache is left as it is): kwok v0.8.0's informer options set resourceVersion
# "0" on every list and every watch of its pod informer, so each restart of
# that watch (client-go's watch timeout, or the API server closing a
# watcher that fell behind) makes the API server send every pod in the
# cluster again as an ADDED event, and kwok matches each against its Stages
# before playing the pods still Pending. At 100,000 pods that was a replay
# of every pod about once a minute and most of kwok's CPU (docs/scale.md,
# "The simulator's own load"). The change keeps "0" where the caller asked
# for no resourceVersion (a first list) and otherwise leaves the caller's
# (the reflector's watch resumes from the last one it saw), as client-go's
# own informers do.
set -euo pipefail
export PATH=/usr/local/go/bin:$PATH
export CGO_ENABLED=0

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mod=$root/hack/kwok
die() { echo "build-kwok: $*" >&2; exit 1; }

version=$(awk '$1 == "require" && $2 == "sigs.k8s.io/kwok" { print $3; exit }' "$mod/go.mod")
[ -n "$version" ] || die "$mod/go.mod does not require sigs.k8s.io/kwok"
cache=${FLATNET_CACHE:-$HOME/.cache/flatnet}/kwok-$version
bin=$cache/bin
out=$bin/kwok

if [ "${1-}" = "--bin-dir" ]; then
  echo "$bin"
  exit 0
fi
[ $# -eq 0 ] || die "unknown argument '$1' (usage: hack/build-kwok.sh [--bin-dir])"
command -v go >/dev/null || die "no go in PATH or /usr/local/go/bin; install Go 1.26 or newer"

mkdir -p "$bin" "$cache/logs"
want=$(printf 'module=sigs.k8s.io/kwok\nversion=%s\ngo=%s\nplatform=%s/%s\nmodsum=%s\nrecipe=%s\n' "$version" \
  "$(go env GOVERSION)" "$(go env GOOS)" "$(go env GOARCH)" \
  "$(cat "$mod/go.mod" "$mod/go.sum" "$mod/tools.go" | sha256sum | cut -d' ' -f1)" \
  "$(sha256sum "${BASH_SOURCE[0]}" | cut -d' ' -f1)")
exec 9>"$cache/.lock"
if ! flock -n 9; then
  echo "build-kwok: another build holds $cache/.lock; waiting"
  flock 9
fi
if [ -x "$out" ] && [ -f "$cache/stamp" ] && [ "$want" = "$(cat "$cache/stamp")" ]; then
  echo "build-kwok: kwok $version is current ($out)"
  exit 0
fi

# kwok's source, copied out of the module cache with the one line changed,
# and a go.mod that builds from the copy (the module cache is left as it
# is; go build cannot overlay files beneath it).
(cd "$mod" && go mod download sigs.k8s.io/kwok) || die "cannot download sigs.k8s.io/kwok $version (module proxy reachable? GOPROXY=$(go env GOPROXY))"
pristine=$(cd "$mod" && go list -m -f '{{.Dir}}' sigs.k8s.io/kwok)
patched=$pristine/pkg/utils/informer/event.go
[ -f "$patched" ] || die "$patched not found: the module's layout changed; see the note on the change above"
[ "$(grep -c '^		opts.ResourceVersion = "0"$' "$patched")" = 1 ] ||
  die "$patched: the line the build changes (opts.ResourceVersion = \"0\") is not there once; kwok $version changed it: check whether the change is still needed"

log=$cache/logs/build.log
echo "build-kwok: building sigs.k8s.io/kwok/cmd/kwok $version (static, -trimpath; about a minute the first time); log $log"
t0=$SECONDS
rm -f "$out.tmp"
rm -rf "$cache/src"
cp -r "$pristine" "$cache/src"
chmod -R u+w "$cache/src"
sed -i 's/^\t\topts.ResourceVersion = "0"$/\t\tif opts.ResourceVersion == "" {\n\t\t\topts.ResourceVersion = "0"\n\t\t}/' "$cache/src/pkg/utils/informer/event.go"
cp "$mod/go.mod" "$cache/build.mod"
cp "$mod/go.sum" "$cache/build.sum"
echo "replace sigs.k8s.io/kwok $version => $cache/src" >>"$cache/build.mod"
if ! (cd "$mod" && nice -n 10 go build -trimpath -ldflags "-s -w" -modfile "$cache/build.mod" \
  -o "$out.tmp" sigs.k8s.io/kwok/cmd/kwok) >"$log" 2>&1; then
  tail -n 30 "$log" >&2
  rm -f "$out.tmp"
  die "build failed (module proxy reachable? GOPROXY=$(go env GOPROXY))"
fi
got=$("$out.tmp" --version 2>&1 | head -1) || true
[[ $got == *"$version"* ]] || { rm -f "$out.tmp"; die "the binary built says '$got', not $version"; }
mv -f "$out.tmp" "$out"
echo "$want" >"$cache/stamp"
echo "build-kwok: built in $((SECONDS - t0))s, $(du -h "$out" | cut -f1): $got"
