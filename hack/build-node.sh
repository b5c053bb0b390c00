#!/usr/bin/env bash
# Builds the upstream programs a real lab node runs (flatnet lab up --runtime
# containerd): containerd, containerd-shim-runc-v2 and ctr from
# github.com/containerd/containerd/v2, runc from github.com/opencontainers/runc
# and crictl from sigs.k8s.io/cri-tools, from the Go module proxy, with the
# versions pinned in hack/node/<module>/go.mod (one module per upstream project,
# so each builds with exactly the dependency versions its release pins). The
# kubelet comes from hack/build-k8s.sh kubelet. Binaries go to a cache outside
# git, all five in one directory:
#
#   ${FLATNET_CACHE:-$HOME/.cache/flatnet}/node-<containerd version>/bin
#
# Usage: hack/build-node.sh [--bin-dir] [NAME ...]
#   no names   build all five
#   NAME       one of: containerd containerd-shim-runc-v2 ctr runc crictl
#   --bin-dir  print the bin directory and exit (builds nothing)
#
# Flags follow each project's own Makefile: containerd and ctr with cgo and the
# tag urfave_cli_no_docs; the shim static without cgo (tags no_grpc too); runc
# with cgo (its nsenter is C), PIE and the tags "seccomp urfave_cli_no_docs"
# (not upstream's default libpathrs: it needs a Rust C library Debian does not
# ship), linked to Debian's libseccomp (hack/deps.sh installs libseccomp-dev,
# pkg-config and gcc); crictl without cgo. Each carries its version in the -X
# variables its Makefile sets. As in build-k8s.sh: a binary is rebuilt only when
# its stamp changes (a second run costs a second), one build at a time per
# cache (a second caller waits on the lock), progress every 15 s, and every
# binary must report the version it was built for before it replaces the old.
set -euo pipefail

export PATH=/usr/local/go/bin:$PATH

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mods=$root/hack/node

die() { echo "build-node: $*" >&2; exit 1; }

command -v go >/dev/null || die "no go in PATH or /usr/local/go/bin; install Go 1.26 or newer"

# modver MODDIR MODULE: the version MODDIR's go.mod requires (no network).
modver() {
  [ -f "$mods/$1/go.mod" ] || die "$mods/$1/go.mod is missing"
  awk -v m="$2" '$1 == "require" { $1 = ""; $0 = $0 } $1 == m && $2 != "=>" { print $2; exit }' "$mods/$1/go.mod"
}
containerd_version=$(modver containerd github.com/containerd/containerd/v2)
runc_version=$(modver runc github.com/opencontainers/runc)
crictl_version=$(modver crictl sigs.k8s.io/cri-tools)
[ -n "$containerd_version" ] || die "github.com/containerd/containerd/v2 is not required in $mods/containerd/go.mod"
[ -n "$runc_version" ] || die "github.com/opencontainers/runc is not required in $mods/runc/go.mod"
[ -n "$crictl_version" ] || die "sigs.k8s.io/cri-tools is not required in $mods/crictl/go.mod"

cache=${FLATNET_CACHE:-$HOME/.cache/flatnet}/node-$containerd_version
bin=$cache/bin
stamps=$cache/stamps
logs=$cache/logs

if [ "${1-}" = "--bin-dir" ]; then
  echo "$bin"
  exit 0
fi

known=(containerd containerd-shim-runc-v2 ctr runc crictl)
want=("$@")
[ ${#want[@]} -gt 0 ] || want=("${known[@]}")
for w in "${want[@]}"; do
  [[ " ${known[*]} " == *" $w "* ]] || die "unknown binary '$w' (want: ${known[*]})"
done

# recipe NAME: module dir, package, CGO_ENABLED, tags, extra go build flags
# and ldflags, one per line.
recipe() {
  local c=github.com/containerd/containerd/v2
  local cx="-X $c/version.Version=$containerd_version -X $c/version.Package=$c"
  case $1 in
    containerd|ctr)
      printf '%s\n' containerd "$c/cmd/$1" 1 urfave_cli_no_docs "" "-s -w $cx" ;;
    containerd-shim-runc-v2)
      printf '%s\n' containerd "$c/cmd/$1" 0 "urfave_cli_no_docs no_grpc" "" "-s -w $cx -extldflags -static" ;;
    runc)
      printf '%s\n' runc github.com/opencontainers/runc 1 "seccomp urfave_cli_no_docs" -buildmode=pie "-s -w" ;;
    crictl)
      printf '%s\n' crictl sigs.k8s.io/cri-tools/cmd/crictl 0 "" "" "-s -w -X sigs.k8s.io/cri-tools/pkg/version.Version=$crictl_version" ;;
  esac
}

mkdir -p "$bin" "$stamps" "$logs"

# One build at a time per cache: a second caller waits, then finds it current.
exec 9>"$cache/.lock"
if ! flock -n 9; then
  echo "build-node: another build holds $cache/.lock; waiting"
  flock 9
fi

gover=$(go env GOVERSION)
# The script's own hash stands for the flags and recipe: edit it, rebuild.
self=$(sha256sum "${BASH_SOURCE[0]}" | cut -d' ' -f1)

# stamp NAME: everything that decides the binary's bytes, without network.
stamp() {
  local r dir sums seccomp=
  mapfile -t r < <(recipe "$1")
  dir=$mods/${r[0]}
  sums=$(cat "$dir/go.mod" "$dir/go.sum" | sha256sum | cut -d' ' -f1)
  # runc links Debian's libseccomp: a new one means a rebuild.
  [ "$1" != runc ] || seccomp=$(pkg-config --modversion libseccomp 2>/dev/null || true)
  printf 'binary=%s\npackage=%s\ncontainerd=%s\nrunc=%s\ncrictl=%s\ngo=%s\nplatform=%s/%s\nmodsum=%s\nlibseccomp=%s\nrecipe=%s\n' \
    "$1" "${r[1]}" "$containerd_version" "$runc_version" "$crictl_version" "$gover" \
    "$(go env GOOS)" "$(go env GOARCH)" "$sums" "$seccomp" "$self"
}

# check NAME PATH: the built binary reports the version it was built for.
check() {
  local out
  case $1 in
    containerd-shim-runc-v2) out=$("$2" -v 2>&1) ;;
    *)                       out=$("$2" --version 2>&1) ;;
  esac
  case $1 in
    runc)   grep -q "^runc version ${runc_version#v}\$" <<<"$out" && grep -q '^libseccomp: ' <<<"$out" ;;
    crictl) grep -q "version $crictl_version\$" <<<"$out" ;;
    *)      grep -q "$containerd_version" <<<"$out" ;;
  esac || die "$2 does not report its version (or runc lacks seccomp); it printed: $out"
  tr '\n' ' ' <<<"$out" | sed 's/  */ /g; s/ $//'
}

fmt_secs() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }

# build NAME: go build -v prints each package it compiles; count them against
# the package's dependency total and print a progress line every 15 seconds.
build() {
  local name=$1 r dir out log total start now last=0 n=0 flags=()
  mapfile -t r < <(recipe "$name")
  dir=$mods/${r[0]}
  out=$bin/$name
  log=$logs/$name.log
  if [ -x "$out" ] && [ -f "$stamps/$name" ] && [ "$(stamp "$name")" = "$(cat "$stamps/$name")" ]; then
    echo "build-node: $name is current ($out)"
    return 0
  fi
  if [ "${r[2]}" = 1 ]; then
    command -v gcc >/dev/null || die "$name needs cgo and there is no gcc; run hack/deps.sh (make deps)"
    if [ "$name" = runc ] && ! pkg-config --exists libseccomp 2>/dev/null; then
      die "runc needs libseccomp-dev and pkg-config; run hack/deps.sh (make deps)"
    fi
  fi
  [ -z "${r[3]}" ] || flags+=(-tags "${r[3]}")
  [ -z "${r[4]}" ] || flags+=("${r[4]}")
  start=$(date +%s)
  echo "build-node: $name: resolving ${r[1]} (downloads modules on a first run)"
  total=$(cd "$dir" && CGO_ENABLED=${r[2]} go list -deps "${flags[@]}" "${r[1]}" | wc -l) ||
    die "$name: go list failed; is the module proxy reachable (GOPROXY=$(go env GOPROXY))?"
  echo "build-node: $name: compiling up to $total packages (nice, -trimpath, CGO_ENABLED=${r[2]}); log $log"
  rm -f "$out.tmp"
  set +e
  (cd "$dir" && CGO_ENABLED=${r[2]} exec nice -n 10 go build -v -trimpath "${flags[@]}" -ldflags "${r[5]}" -o "$out.tmp" "${r[1]}") 2>&1 |
    tee "$log" |
    while IFS= read -r line; do
      # Package paths alone on a line are progress; anything else is build output.
      [[ $line =~ ^[A-Za-z0-9._~/-]+$ ]] && n=$((n + 1))
      now=$(date +%s)
      if [ $((now - last)) -ge 15 ]; then
        last=$now
        echo "build-node: $name: $n/$total packages compiled, $(fmt_secs $((now - start)))"
      fi
    done
  local rc=${PIPESTATUS[0]}
  set -e
  if [ "$rc" != 0 ] || [ ! -x "$out.tmp" ]; then
    rm -f "$out.tmp"
    echo "build-node: $name: go build failed (exit $rc); last lines of $log:" >&2
    tail -n 30 "$log" >&2
    exit 1
  fi
  # Only a complete, checked binary replaces the old one, then its stamp.
  check "$name" "$out.tmp" >/dev/null
  mv -f "$out.tmp" "$out"
  stamp "$name" >"$stamps/$name"
  now=$(date +%s)
  echo "build-node: $name: built in $(fmt_secs $((now - start))), $(du -h "$out" | cut -f1), $(check "$name" "$out")"
}

t0=$(date +%s)
i=0
for w in "${want[@]}"; do
  i=$((i + 1))
  echo "build-node: [$i/${#want[@]}] $w"
  build "$w"
done
echo "build-node: done in $(fmt_secs $(($(date +%s) - t0))); binaries in $bin"
