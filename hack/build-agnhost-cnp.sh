#!/usr/bin/env bash
# Builds agnhost-cnp: the lab's agnhost (k8s.io/kubernetes test/images/agnhost,
# the version hack/k8s/go.mod pins) with one change, for the image the
# ClusterNetworkPolicy conformance suite runs (registry.k8s.io/e2e-test-images/
# agnhost:2.45 in the lab, internal/lab/images).
#
# Why: every pod of the suite's fixture (network-policy-api conformance/base/
# manifests.yaml) has two containers running `agnhost porter` with
# SERVE_SCTP_PORT_<n>. On a kernel without SCTP (this machine: CONFIG_IP_SCTP
# is not set, socket(AF_INET, SOCK_STREAM, IPPROTO_SCTP) fails with
# EPROTONOSUPPORT) upstream's porter exits (log.Fatal), the containers
# crash-loop, the StatefulSets never become Ready and the suite cannot set
# up at all. The change: when listening for SCTP fails with "protocol not
# supported", porter logs it and keeps running instead of exiting. Nothing
# else differs; on a kernel with SCTP the binary behaves as upstream's. The
# suite's manifests and tests are not touched; its SCTP tests are skipped
# by hack/conformance.sh (phase cnp) with that reason.
#
# The patched porter.go is made at build time from the module's file (no copy
# of upstream code in this repository; each edit must match exactly once or
# the build stops) into a throwaway package beside agnhost's main file, whose
# porter import is pointed at it (go build -overlay refuses files in the
# module cache). Output: <hack/build-k8s.sh --bin-dir>/agnhost-cnp,
# rebuilt only when its stamp (this script, go.mod/go.sum, Go version)
# changes.
set -euo pipefail
export PATH=/usr/local/go/bin:$PATH
export CGO_ENABLED=0
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
mod=$root/hack/k8s
die() { echo "build-agnhost-cnp: $*" >&2; exit 1; }

bin=$("$root/hack/build-k8s.sh" --bin-dir)
stamps=$(dirname "$bin")/stamps
out=$bin/agnhost-cnp
mkdir -p "$bin" "$stamps"
stamp=$(cat "${BASH_SOURCE[0]}" "$mod/go.mod" "$mod/go.sum" | sha256sum | cut -d' ' -f1)
stamp+=" $(go env GOVERSION)"
if [ -x "$out" ] && [ "$(cat "$stamps/agnhost-cnp" 2>/dev/null)" = "$stamp" ]; then
  echo "build-agnhost-cnp: current ($out)"
  exit 0
fi

pkg=k8s.io/kubernetes/test/images/agnhost
dir=$(cd "$mod" && go list -f '{{.Dir}}' "$pkg")
src=$dir/porter/porter.go
[ -f "$src" ] && [ -f "$dir/agnhost.go" ] || die "$dir: no agnhost.go or porter/porter.go (run hack/build-k8s.sh agnhost first)"
# Inside hack/k8s, so that its go.mod pins every dependency.
tmp=$(mktemp -d "$mod/agnhost-cnp-build.XXXXXX")
trap 'rm -rf "$tmp"' EXIT
mkdir "$tmp/porter" "$tmp/main"

# The two edits, each checked to apply exactly once.
fatal='		log.Fatal("Failed to listen SCTP. error:", err)'
[ "$(grep -cxF "$fatal" "$src")" = 1 ] || die "$src: the SCTP listen error line changed upstream; update this script"
[ "$(grep -cxF '	"strings"' "$src")" = 1 ] || die "$src: its imports changed upstream; update this script"
awk -v fatal="$fatal" '
  $0 == "\t\"strings\"" { print; print "\t\"time\""; next }
  $0 == fatal {
    print "\t\tif strings.Contains(err.Error(), \"protocol not supported\") {"
    print "\t\t\t// flatnet lab (hack/build-agnhost-cnp.sh): no SCTP in this kernel; stay up."
    print "\t\t\tlog.Printf(\"SCTP port %s not served: %v (this kernel has no SCTP)\", port, err)"
    print "\t\t\tfor {"
    print "\t\t\t\ttime.Sleep(time.Hour)"
    print "\t\t\t}"
    print "\t\t}"
  }
  { print }
' "$src" >"$tmp/porter/porter.go"
imp='	"k8s.io/kubernetes/test/images/agnhost/porter"'
[ "$(grep -cxF "$imp" "$dir/agnhost.go")" = 1 ] || die "$dir/agnhost.go: its porter import changed upstream; update this script"
local=github.com/flatnet/flatnet/hack/k8s/$(basename "$tmp")/porter
awk -v imp="$imp" -v local="$local" '$0 == imp { print "\tporter \"" local "\""; next } { print }' "$dir/agnhost.go" >"$tmp/main/agnhost.go"

t0=$SECONDS
echo "build-agnhost-cnp: building $pkg with porter patched ($tmp)"
(cd "$mod" && nice -n 10 go build -trimpath -ldflags "-s -w" -o "$out.tmp" "./$(basename "$tmp")/main")
"$out.tmp" --help 2>&1 | grep -q '^  porter ' || die "$out.tmp has no porter command"
mv -f "$out.tmp" "$out"
echo "$stamp" >"$stamps/agnhost-cnp"
echo "build-agnhost-cnp: built in $((SECONDS - t0)) s: $out"
