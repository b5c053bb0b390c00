#!/usr/bin/env bash
# build-echo-basic: the Gateway API conformance suite's backend,
# sigs.k8s.io/gateway-api/conformance/echo-basic at the version test/gateway
# pins (a `tool` of that module, so flatnet's go.mod stays clean), static,
# -trimpath, stripped, as upstream's docker/Dockerfile.echo-basic builds it,
# into the cache make k8s uses (hack/cached-go-build.sh). The lab's images
# carry it as registry.k8s.io/gateway-api/echo-basic:v1.5.1 and
# :v1.6.0-dev.3 (internal/lab/images), the tags the suite's base manifests
# name. Rebuilt only when test/gateway's go.mod/go.sum or the Go version
# change. Prints nothing when the cached binary is current.
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/go/bin:$PATH
mod=test/gateway
gv=$(awk '$1 == "sigs.k8s.io/gateway-api/conformance" { print $2; exit }' "$mod/go.mod")
[ -n "$gv" ] || { echo "build-echo-basic: $mod/go.mod does not require sigs.k8s.io/gateway-api/conformance" >&2; exit 1; }
want=$(printf 'binary=echo-basic\nconformance=%s\ngo=%s\nmodsum=%s\n' "$gv" "$(go env GOVERSION)" \
  "$(cat "$mod/go.mod" "$mod/go.sum" | sha256sum | cut -d' ' -f1)")
# The check: the binary records the conformance module it came from.
exec hack/cached-go-build.sh echo-basic "$mod" sigs.k8s.io/gateway-api/conformance/echo-basic "$want" \
  sh -c 'go version -m "$1" | grep -q "^[[:space:]]mod[[:space:]]*sigs.k8s.io/gateway-api/conformance[[:space:]]*$0[[:space:]]"' "$gv"
