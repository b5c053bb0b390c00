#!/usr/bin/env bash
# ref-cni: the reference CNI plugins (containernetworking/plugins
# REF_CNI_VERSION, default v1.10.0: bridge, host-local, bandwidth, portmap,
# loopback), built once through the Go module proxy into a cache outside
# git and reused after; prints that directory. Shared by bench-cni and
# bench-pods.
#
# Environment: REF_CNI_VERSION (v1.10.0), REF_CNI_DIR (the cache dir,
# default ${XDG_CACHE_HOME:-/root/.cache}/flatnet/ref-cni-<version>).
set -euo pipefail
export PATH=/usr/local/go/bin:$PATH

ref_version=${REF_CNI_VERSION:-v1.10.0}
ref_dir=${REF_CNI_DIR:-${XDG_CACHE_HOME:-/root/.cache}/flatnet/ref-cni-${ref_version}}
ref_plugins=(main/bridge ipam/host-local meta/bandwidth meta/portmap main/loopback)

# Another helper may install host-local into the same dir; only what is
# missing is built, one `go install` per plugin.
mkdir -p "$ref_dir"
for p in "${ref_plugins[@]}"; do
  name=${p##*/}
  if [ ! -x "$ref_dir/$name" ]; then
    echo "ref-cni: building reference $name $ref_version into $ref_dir" >&2
    (cd / && GOBIN="$ref_dir" GOFLAGS=-mod=mod GO111MODULE=on \
      go install "github.com/containernetworking/plugins/plugins/$p@$ref_version") >&2
  fi
done
echo "$ref_dir"
