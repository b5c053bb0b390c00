#!/usr/bin/env bash
# bench-cni: times ADD and DEL per pod through libcni for one conflist
# (bridge+host-local with ipMasq -> bandwidth -> portmap), with the
# reference plugins (containernetworking/plugins, built through the Go
# module proxy into a cache outside git) and flatnet-cni alternating pod by
# pod in one run. Everything happens in network namespaces the harness
# creates and deletes; see test/bench/cnibench and docs/benchmarks.md.
#
# Usage: hack/bench-cni.sh [harness flags], e.g. -pods 50 -json out.json,
# -update-doc docs/benchmarks.md (rewrite its final-run section).
# Environment: REF_CNI_VERSION (v1.10.0), REF_CNI_DIR (the cache dir),
# FLATNET_CNI_PATH (use this install of ours instead of building it),
# BENCH_UPDATE_DOC=1 (same as -update-doc docs/benchmarks.md).
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/go/bin:$PATH

if [ "$(id -u)" != 0 ]; then
  echo "bench-cni: needs root (network namespaces, bridges, nftables); run as root" >&2
  exit 1
fi

hack/deps.sh

ref_version=${REF_CNI_VERSION:-v1.10.0}
ref_dir=$(REF_CNI_VERSION=$ref_version hack/ref-cni.sh)

run_id=fnb$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n')
work=$(mktemp -d /tmp/flatnet-bench-cni.XXXXXX)
cleanup() {
  # The harness removes its own namespaces; this is the net for a hard
  # kill (a second Ctrl-C). Only names carrying this run's id are touched.
  for ns in $(ip netns list 2>/dev/null | awk '{print $1}' | grep "^${run_id}" || true); do
    echo "bench-cni: removing leftover netns $ns" >&2
    ip netns delete "$ns" || true
  done
  rm -rf "$work"
}
trap cleanup EXIT

ours_dir=${FLATNET_CNI_PATH:-}
if [ -z "$ours_dir" ]; then
  ours_dir=$work/ours-bin
  make -s install-cni DESTDIR="$ours_dir" >/dev/null
fi

go build -o "$work/cnibench" ./test/bench/cnibench
extra=()
if [ -n "${BENCH_UPDATE_DOC:-}" ]; then
  extra+=(-update-doc docs/benchmarks.md)
fi
"$work/cnibench" -ref "$ref_dir" -ours "$ours_dir" -prefix "$run_id" -workdir "$work" \
  -ref-version "$ref_version" -ours-version "$("$ours_dir/flatnet-cni" --version 2>/dev/null | head -1 || echo unknown)" "${extra[@]}" "$@"
