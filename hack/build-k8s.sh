#!/usr/bin/env bash
# Builds the upstream programs flatnet's lab runs: the control plane
# (kube-apiserver, kube-controller-manager, kube-scheduler and kubectl from
# k8s.io/kubernetes, etcd from go.etcd.io/etcd/server/v3) and, on demand, what
# real nodes and the conformance suite need (kubelet, agnhost, e2e.test and
# the ginkgo CLI), from the Go module proxy, with the versions pinned in
# hack/k8s/go.mod. Binaries go to a cache outside git:
#
#   ${FLATNET_CACHE:-$HOME/.cache/flatnet}/k8s-<kubernetes version>/bin
#
# Usage: hack/build-k8s.sh [--bin-dir] [NAME ...]
#   no names   build the control plane (the five every lab runs)
#   NAME       one of: kube-apiserver kube-controller-manager kube-scheduler
#              kubectl etcd kubelet agnhost e2e.test ginkgo
#   --bin-dir  print the bin directory and exit (builds nothing)
#
# A binary is rebuilt only when its stamp (module versions, go.mod/go.sum hash,
# Go version, flags) differs from the one written after its last good build, so
# a second run costs a second. The first build of kube-apiserver takes several
# minutes on 2 cores: the script prints progress (packages compiled out of the
# total) and the time each binary took. Builds are niced, -trimpath, static
# (CGO_ENABLED=0) and stripped, as upstream's release builds are, and carry the
# kubernetes version in the same -X variables upstream's hack/lib/version.sh
# sets, so `kube-apiserver --version` says the real version.
#
# Go: the module needs go 1.26 (/usr/local/go/bin/go 1.26.8 is enough). If a
# later kubernetes needs Go 1.27, run with `export GOTOOLCHAIN=go1.27.3` (the go
# command then takes that toolchain from the module proxy) and say so here.
set -euo pipefail

export PATH=/usr/local/go/bin:$PATH
export CGO_ENABLED=0

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mod=$root/hack/k8s

die() { echo "build-k8s: $*" >&2; exit 1; }

command -v go >/dev/null || die "no go in PATH or /usr/local/go/bin; install Go 1.26 or newer"
[ -f "$mod/go.mod" ] || die "$mod/go.mod is missing"

# Versions come from go.mod alone (no network): the require block's lines.
modver() {
  awk -v m="$1" '$1 == m && $2 != "=>" { print $2; exit }' "$mod/go.mod"
}
kube_version=$(modver k8s.io/kubernetes)
etcd_version=$(modver go.etcd.io/etcd/server/v3)
ginkgo_version=$(modver github.com/onsi/ginkgo/v2)
[ -n "$kube_version" ] || die "k8s.io/kubernetes is not required in $mod/go.mod"
[ -n "$etcd_version" ] || die "go.etcd.io/etcd/server/v3 is not required in $mod/go.mod"

cache=${FLATNET_CACHE:-$HOME/.cache/flatnet}/k8s-$kube_version
bin=$cache/bin
stamps=$cache/stamps
logs=$cache/logs

if [ "${1-}" = "--bin-dir" ]; then
  echo "$bin"
  exit 0
fi

controlplane=(kube-apiserver kube-controller-manager kube-scheduler kubectl etcd)
known=("${controlplane[@]}" kubelet agnhost e2e.test ginkgo)
want=("$@")
[ ${#want[@]} -gt 0 ] || want=("${controlplane[@]}")
for w in "${want[@]}"; do
  [[ " ${known[*]} " == *" $w "* ]] || die "unknown binary '$w' (want: ${known[*]})"
done

pkg_of() {
  case $1 in
    etcd)     echo go.etcd.io/etcd/server/v3 ;;
    agnhost)  echo k8s.io/kubernetes/test/images/agnhost ;;
    e2e.test) echo k8s.io/kubernetes/test/e2e ;;
    ginkgo)   echo github.com/onsi/ginkgo/v2/ginkgo ;;
    *)        echo "k8s.io/kubernetes/cmd/$1" ;;
  esac
}

# The -X variables upstream sets (hack/lib/version.sh), in both packages that
# carry them. gitCommit and gitTreeState stay unset: a module zip has no commit.
# buildDate is the tag's time from the proxy, so rebuilds are reproducible.
kube_ldflags() {
  local date=$1 v=${kube_version#v} flags="-s -w" p
  local major=${v%%.*} rest=${v#*.}
  local minor=${rest%%.*}
  for p in k8s.io/component-base/version k8s.io/client-go/pkg/version; do
    flags+=" -X $p.gitVersion=$kube_version -X $p.gitMajor=$major -X $p.gitMinor=$minor"
    [ -z "$date" ] || flags+=" -X $p.buildDate=$date"
  done
  echo "$flags"
}

mkdir -p "$bin" "$stamps" "$logs"

# One build at a time per cache: a second caller waits, then finds it current.
exec 9>"$cache/.lock"
if ! flock -n 9; then
  echo "build-k8s: another build holds $cache/.lock; waiting"
  flock 9
fi

gover=$(go env GOVERSION)
sums=$(cat "$mod/go.mod" "$mod/go.sum" | sha256sum | cut -d' ' -f1)
# The script's own hash stands for the flags and recipe: edit it, rebuild.
recipe=$(sha256sum "${BASH_SOURCE[0]}" | cut -d' ' -f1)

# stamp NAME: everything that decides the binary's bytes, without network.
stamp() {
  printf 'binary=%s\npackage=%s\nkubernetes=%s\netcd=%s\ngo=%s\nplatform=%s/%s\nmodsum=%s\nrecipe=%s\n' \
    "$1" "$(pkg_of "$1")" "$kube_version" "$etcd_version" "$gover" \
    "$(go env GOOS)" "$(go env GOARCH)" "$sums" "$recipe"
}

# check NAME: the built binary reports the version it was built for.
check() {
  local out
  case $1 in
    kubectl)  out=$("$2" version --client 2>&1) ;;
    agnhost)  out=$("$2" --help 2>&1) ;;  # its root command is "app", with no version
    ginkgo)   out=$("$2" version 2>&1) ;;
    *)        out=$("$2" --version 2>&1) ;;
  esac
  case $1 in
    etcd)     grep -q "etcd Version: ${etcd_version#v}\$" <<<"$out" ;;
    agnhost)  grep -q "^  netexec " <<<"$out" ;;
    ginkgo)   grep -q "Ginkgo Version ${ginkgo_version#v}\$" <<<"$out" ;;
    e2e.test) grep -q "$kube_version" <<<"$out" ;;
    *)        grep -q "$kube_version\$" <<<"$out" ;;
  esac || die "$2 does not report its version; it printed: $out"
  head -1 <<<"$out"
}

fmt_secs() { printf '%dm%02ds' $(($1 / 60)) $(($1 % 60)); }

# build NAME: go build -v prints each package it compiles; count them against
# the package's dependency total and print a progress line every 15 seconds.
build() {
  local name=$1 pkg out log total start now last=0 n=0 ldflags=
  pkg=$(pkg_of "$name")
  out=$bin/$name
  log=$logs/$name.log
  if [ -x "$out" ] && [ -f "$stamps/$name" ] && [ "$(stamp "$name")" = "$(cat "$stamps/$name")" ]; then
    echo "build-k8s: $name is current ($out)"
    return 0
  fi
  start=$(date +%s)
  echo "build-k8s: $name: resolving $pkg (downloads modules on a first run)"
  total=$(cd "$mod" && go list -deps "$pkg" | wc -l) ||
    die "$name: go list failed; is the module proxy reachable (GOPROXY=$(go env GOPROXY))?"
  if [ "$name" = e2e.test ]; then
    total=$(cd "$mod" && go list -deps -test "$pkg" | wc -l)
  fi
  if [ "$name" != etcd ] && [ "$name" != ginkgo ]; then
    local date
    date=$(cd "$mod" && go list -m -f '{{if .Time}}{{.Time.UTC.Format "2006-01-02T15:04:05Z"}}{{end}}' k8s.io/kubernetes)
    ldflags=$(kube_ldflags "$date")
  else
    ldflags="-s -w"
  fi
  echo "build-k8s: $name: compiling up to $total packages (nice, -trimpath); log $log"
  rm -f "$out.tmp"
  set +e
  local gobuild=(go build -v)
  # e2e.test is the package's test binary, as upstream builds it (go test
  # -c lists no packages: its progress line stays at 0).
  [ "$name" != e2e.test ] || gobuild=(go test -c)
  (cd "$mod" && exec nice -n 10 "${gobuild[@]}" -trimpath -ldflags "$ldflags" -o "$out.tmp" "$pkg") 2>&1 |
    tee "$log" |
    while IFS= read -r line; do
      # Package paths alone on a line are progress; anything else is build output.
      [[ $line =~ ^[A-Za-z0-9._~/-]+$ ]] && n=$((n + 1))
      now=$(date +%s)
      if [ $((now - last)) -ge 15 ]; then
        last=$now
        echo "build-k8s: $name: $n/$total packages compiled, $(fmt_secs $((now - start)))"
      fi
    done
  local rc=${PIPESTATUS[0]}
  set -e
  if [ "$rc" != 0 ] || [ ! -x "$out.tmp" ]; then
    rm -f "$out.tmp"
    echo "build-k8s: $name: go build failed (exit $rc); last lines of $log:" >&2
    tail -n 30 "$log" >&2
    exit 1
  fi
  # Only a complete, checked binary replaces the old one, then its stamp.
  check "$name" "$out.tmp" >/dev/null
  mv -f "$out.tmp" "$out"
  stamp "$name" >"$stamps/$name"
  now=$(date +%s)
  echo "build-k8s: $name: built in $(fmt_secs $((now - start))), $(du -h "$out" | cut -f1), $(check "$name" "$out")"
}

t0=$(date +%s)
i=0
for w in "${want[@]}"; do
  i=$((i + 1))
  echo "build-k8s: [$i/${#want[@]}] $w"
  build "$w"
done
echo "build-k8s: done in $(fmt_secs $(($(date +%s) - t0))); binaries in $bin"
