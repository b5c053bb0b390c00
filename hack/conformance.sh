#!/usr/bin/env bash
# make conformance: Kubernetes' own sig-network e2e suite (e2e.test v1.37.2,
# run by the ginkgo CLI it pins) against a lab of its own, in phases, with
# the JUnit report and a summary table per phase (docs/conformance.md).
#
#   conformance   \[sig-network\].*\[Conformance\]   (the 47 the issue asks for)
#   networkpolicy \[Feature:NetworkPolicy\]
#   sig-network   \[sig-network\] (Services|DNS|Networking), the non-conformance rest
#   cnp           sigs.k8s.io/network-policy-api v0.3.0's ClusterNetworkPolicy
#                 conformance suite (not e2e.test: `go test` of test/cnp, a
#                 module of its own), profile ClusterNetworkPolicy; writes
#                 <REPORT_DIR>/cnp/summary.md, junit.xml and the suite's
#                 report.yaml. Not in the default PHASES.
#   gateway       sigs.k8s.io/gateway-api v1.6.3's Gateway API conformance
#                 suite (`go test` of test/gateway, a module of its own),
#                 GatewayClass flatnet, profile GATEWAY-HTTP, run in the
#                 external host's network namespace fl-<lab>-ext (the only
#                 place the lab's LoadBalancer range is routed to; the lab
#                 gets --external for it); writes <REPORT_DIR>/gateway/
#                 summary.md and the suite's report.yaml. Not in the default
#                 PHASES; `make conformance-gateway` runs it alone.
#
# Every phase skips what test/conformance/skip.txt lists (one regexp a line,
# each with its reason). Builds what it needs (make build, make k8s,
# e2e.test, ginkgo, kubectl), brings up the lab, runs the phases one after
# another, writes <REPORT_DIR>/<phase>/summary.md and junit.xml (the suite's
# JUnit report cut to the phase's specs: the whole one lists all ~3,200 specs
# of e2e.test, 1.1 MB) and takes the lab down at the end, also on failure or
# Ctrl-C. The suite's own output stays in _output/conformance/<phase>/
# (ginkgo.log, junit_01.xml; git ignores _output). Exits 1 when a focused
# spec that is not skipped failed in any phase. Needs root.
#
#   RUNTIME     the lab's pod runtime: containerd (the default once `flatnet
#               lab up` has --runtime) or process (the lab's own; pods run
#               host binaries, so specs that need images or kubectl exec
#               fail: not an official run)
#   INSTALL     with containerd: manifest (default: flatnet installed from
#               deploy/flatnet.yaml, as users install it, so the suite judges
#               the DaemonSet, Deployment, RBAC and image) or process (the
#               lab starts flatnet's controller and agents itself)
#   NODES       lab nodes (default 3: the suite wants at least 2, and one
#               Services spec (externalTrafficPolicy changes) skips itself
#               below 3)
#   PROCS       parallel ginkgo processes (default 4; [Serial] specs run
#               after the others on one process, as ginkgo does)
#   PHASES      which phases, in order (default "conformance networkpolicy sig-network")
#   FOCUS       replaces every phase's focus regexp (to iterate on one spec;
#               use with PHASES=<one phase>); for cnp, a regexp of the
#               suite's test names (CNPAdminTierEgressTCP|LabBaseline)
#   CNP_SKIP    cnp: more tests to skip, "ShortName=reason,..." (the tests
#               that probe SCTP are skipped by themselves on a kernel
#               without SCTP, each with that reason)
#   CNP_ARGS    cnp: more flags for the runner (the suite's own:
#               -supported-features=..., -debug, ...; test/cnp/cnp_test.go)
#   GATEWAY_SKIP  gateway: tests to skip, "ShortName,ShortName" (the suite's
#               -skip-tests; its report then says partial)
#   GATEWAY_ARGS  gateway: more flags for the runner (the suite's own:
#               -supported-features=..., -debug, -cleanup-base-resources=false,
#               ...; test/gateway/gateway_test.go). FOCUS for gateway is one
#               test's name (the suite's -run-test: HTTPRouteSimpleSameNamespace)
#   SKIP        a regexp skipped on top of the skip list
#   REPORT_DIR  where <phase>/ goes (default docs/conformance with the
#               containerd runtime, _output/conformance-<runtime> otherwise,
#               so that no unofficial report lands in docs/)
#   LAB_NAME    lab name (default conformance)
#   TIMEOUT     ginkgo's suite timeout per phase (default 3h)
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/go/bin:$PATH

die() { echo "conformance: $*" >&2; exit 2; }
say() { printf '\n\033[1m== conformance: %s\033[0m\n' "$*"; }
[ "$(id -u)" = 0 ] || die "needs root (the lab: network namespaces, interfaces): run \`sudo make conformance\`"

name=${LAB_NAME:-conformance}
nodes=${NODES:-3}
procs=${PROCS:-4}
phases=${PHASES:-conformance networkpolicy sig-network}
timeout=${TIMEOUT:-3h}
skipfile=test/conformance/skip.txt
[[ $nodes =~ ^[0-9]+$ ]] && [ "$nodes" -ge 2 ] || die "NODES=$nodes: the suite needs at least 2 nodes"
[[ $procs =~ ^[1-9][0-9]*$ ]] || die "PROCS=$procs: want a positive number"

# focus PHASE: the phase's regexp; extra_skip PHASE: what it leaves to another phase.
focus() {
  case $1 in
    conformance)   echo '\[sig-network\].*\[Conformance\]' ;;
    networkpolicy) echo '\[Feature:NetworkPolicy\]' ;;
    sig-network)   echo '\[sig-network\] (Services|DNS|Networking)' ;;
    cnp)           echo '.*' ;;
    gateway)       echo '' ;;
    *) die "unknown phase '$1' in PHASES (want: conformance networkpolicy sig-network cnp gateway)" ;;
  esac
}
extra_skip() { [ "$1" != sig-network ] || echo '\[Conformance\]|\[Feature:NetworkPolicy\]'; }
for p in $phases; do focus "$p" >/dev/null; done

say "build: make build, make k8s, e2e.test ginkgo kubectl (minutes the first time, cached after)"
hack/deps.sh >/dev/null
make -s build
make -s k8s
hack/build-k8s.sh e2e.test ginkgo kubectl
k8sbin=$(hack/build-k8s.sh --bin-dir)
flatnet=$PWD/bin/flatnet

# --runtime is passed only when the lab has it; the process runtime is
# what a lab without it runs.
has_runtime_flag=
"$flatnet" lab up --help 2>&1 | grep -q -- '--runtime' && has_runtime_flag=1
runtime=${RUNTIME-}
if [ -z "$runtime" ]; then
  if [ -n "$has_runtime_flag" ]; then runtime=containerd; else runtime=process; fi
fi
runtime_flags=()
install=
if [ -n "$has_runtime_flag" ]; then
  runtime_flags=(--runtime "$runtime")
elif [ "$runtime" != process ]; then
  die "RUNTIME=$runtime: this flatnet lab has no --runtime flag yet (only the process runtime)"
fi
# Real nodes: the kubelet, containerd and runc (make node), the offline
# images (make images; it builds agnhost and CoreDNS first).
if [ "$runtime" = containerd ]; then
  hack/build-k8s.sh kubelet
  make -s node images
  install=${INSTALL:-manifest}
  runtime_flags+=(--install "$install")
fi
# The Gateway API suite reaches Gateways at their LoadBalancer addresses,
# routed only from the lab's external host.
if [[ " $phases " == *" gateway "* ]]; then
  [ "$runtime" = containerd ] || die "RUNTIME=$runtime: phase gateway needs the containerd runtime (the suite's backends are echo-basic images)"
  runtime_flags+=(--external)
fi
reports=${REPORT_DIR:-}
if [ -z "$reports" ]; then
  if [ "$runtime" = containerd ]; then reports=docs/conformance; else reports=_output/conformance-$runtime; fi
fi

tmp=$(mktemp -d /tmp/flatnet-conformance.XXXXXX)
go build -o "$tmp/conformance-report" ./hack/conformance-report
if [[ " $phases " == *" cnp "* ]]; then
  # The CNP runner and its report tool (test/cnp: a module of its own).
  (cd test/cnp && go test -c -o "$tmp/cnp.test" . && go build -o "$tmp/cnp-report" ./cmd/cnp-report)
  go build -o "$tmp/testreport" ./hack/testreport
fi
if [[ " $phases " == *" gateway "* ]]; then
  # The Gateway API runner and its report tool (test/gateway: a module of
  # its own); the echo-basic images came with make images.
  (cd test/gateway && go test -c -o "$tmp/gateway.test" . && go build -o "$tmp/gateway-report" ./cmd/gateway-report)
  go build -o "$tmp/testreport" ./hack/testreport
fi
skip=$("$tmp/conformance-report" skip "$skipfile")

lab() { "$flatnet" lab --name "$name" "$@"; }
labup=
current= # the running ginkgo: its PID is its process group's (setsid)
cleanup() {
  local rc=$?
  set +e
  if [ -n "$current" ]; then
    # TERM to ginkgo's process group (see setsid below; a background job
    # ignores INT): the e2e.test processes interrupt their specs and clean
    # up, the ginkgo CLI waits for them; what is left after a minute is
    # KILLed. The phase is then summarized if a JUnit report was written.
    kill -TERM -- "-$current" 2>/dev/null || kill -TERM "$current" 2>/dev/null
    for _ in $(seq 600); do kill -0 -- "-$current" 2>/dev/null || break; sleep 0.1; done
    kill -KILL -- "-$current" 2>/dev/null
    current=
    report_phase 130 || true
  fi
  if [ -n "$labup" ]; then
    say "lab down ($name)"
    lab down || { echo "conformance: lab down $name failed" >&2; rc=1; }
  fi
  rm -rf "$tmp"
  exit "$rc"
}
trap cleanup EXIT
trap 'exit 130' INT
trap 'exit 143' TERM

# A lab of this name left by a killed run is stale: start from nothing.
if lab status >/dev/null 2>&1; then
  say "a lab named $name is up (left by an earlier run?): taking it down first"
  lab down
fi
say "lab up: --nodes $nodes${runtime_flags[*]:+ ${runtime_flags[*]}} (runtime $runtime)"
labup=1
t0=$SECONDS
lab up --nodes "$nodes" "${runtime_flags[@]}" --timeout 5m
echo "conformance: lab up took $((SECONDS - t0)) s"
kubeconfig=$(lab kubeconfig)

versions="e2e.test $("$k8sbin/e2e.test" --version 2>/dev/null | head -1 | awk '{print $NF}'), $("$k8sbin/ginkgo" version),"
versions+=" flatnet $(git describe --tags --always --dirty 2>/dev/null || echo dev), kernel $(uname -r)"

# report_phase GINKGO_EXIT: the running phase's summary.md and junit.xml;
# fails when a spec or ginkgo did.
report_phase() {
  local grc=$1 took=$((SECONDS - t0))
  if [ "$phase" = cnp ]; then
    report_cnp "$grc"
    return
  fi
  if [ "$phase" = gateway ]; then
    report_gateway "$grc"
    return
  fi
  echo "conformance: phase $phase: ginkgo exited $grc after $((took / 60))m$((took % 60))s"
  if [ ! -f "$raw/junit_01.xml" ]; then
    echo "conformance: phase $phase wrote no $raw/junit_01.xml (the suite did not start; see $log)" >&2
    return 1
  fi
  local a=(-junit "$raw/junit_01.xml" -skip-file "$skipfile" -focus "$f" -o "$out/summary.md" -junit-out "$out/junit.xml"
    -title "make conformance: $phase"
    -info "Date: $(date -u '+%Y-%m-%d %H:%M UTC'); phase took $((took / 60))m$((took % 60))s (ginkgo exit $grc)"
    -info "Lab: $nodes nodes, runtime $runtime${install:+, flatnet installed by $install}, $procs ginkgo processes"
    -info "Versions: $versions"
    -info "Command: \`KUBERNETES_CONFORMANCE_TEST=y ginkgo -p --procs=$procs --timeout=$timeout e2e.test -- ${args[*]:0:7} --ginkgo.focus='$f' --ginkgo.skip=<$skipfile>${x:+|$x}\`")
  [ -z "$x" ] || a+=(-skip "$x")
  "$tmp/conformance-report" summary "${a[@]}" || return 1
  # ginkgo's own verdict counts too (a suite that stopped early).
  [ "$grc" = 0 ]
}

# run_cnp: the ClusterNetworkPolicy suite (test/cnp): its events (go tool
# test2json, as go test -json) to $raw/events.json, what passed and failed
# to the console as it happens (hack/testreport), the plain -v text to $log
# (report_cnp).
run_cnp() {
  local args=(-test.v=test2json -test.count=1 "-test.timeout=$timeout" "-test.run=TestClusterNetworkPolicyConformance/($f)\$"
    "-report-output=$raw/report.yaml" "-flatnet-version=$flatnet_version" -skip-tests="${CNP_SKIP:-}")
  # shellcheck disable=SC2206 # CNP_ARGS is words on purpose
  args+=(${CNP_ARGS:-})
  cnp_cmd="KUBECONFIG=<lab> go test ./test/cnp -args ${args[*]}"
  say "phase cnp: network-policy-api v0.3.0 conformance, profile ClusterNetworkPolicy (log: $log)"
  start_runner "$tmp/cnp.test" "" "${args[@]}"
}

# start_runner BINARY NETNS ARGS...: a Go test binary as the phase's
# runner, in network namespace NETNS when not empty (nsenter --net: the
# rest is this machine's), with KUBECONFIG the lab's. setsid: the runner
# and its pipe lead a process group of their own. Its events (go tool
# test2json) go to $raw/events.json, what passes and fails to the console
# as it happens (hack/testreport).
start_runner() {
  local bin=$1 netns=$2
  shift 2
  local cmd=("$bin" "$@")
  [ -z "$netns" ] || cmd=(nsenter "--net=$netns" "${cmd[@]}")
  # shellcheck disable=SC2016 # expanded by the inner bash
  KUBECONFIG=$kubeconfig setsid bash -c 'set -o pipefail; p=$0 ev=$1 tr=$2; shift 2; "$@" 2>&1 | go tool test2json -t -p "$p" | tee "$ev" | "$tr" -slow 1ns' \
    "$phase" "$raw/events.json" "$tmp/testreport" "${cmd[@]}" &
}

# runner_exited EXIT [LAB-NOTE]: says how the phase's runner ended, keeps
# the suite's report.yaml beside the summary and sets report_args, the
# report tool's flags every such phase passes (events, log, report,
# summary, the Date and Lab lines).
runner_exited() {
  local took=$((SECONDS - t0))
  echo "conformance: phase $phase: runner exited $1 after $((took / 60))m$((took % 60))s"
  [ ! -f "$raw/report.yaml" ] || cp "$raw/report.yaml" "$out/report.yaml"
  report_args=(-events "$raw/events.json" -log "$log" -report "$raw/report.yaml" -o "$out/summary.md"
    -info "Date: $(date -u '+%Y-%m-%d %H:%M UTC'); phase took $((took / 60))m$((took % 60))s (runner exit $1)"
    -info "Lab: $nodes nodes, runtime $runtime${install:+, flatnet installed by $install}${2:-}")
}

# report_cnp EXIT: summary.md, junit.xml and the suite's report.yaml of
# the cnp phase.
report_cnp() {
  local grc=$1
  runner_exited "$grc"
  local focus=()
  [ -z "${FOCUS:-}" ] || focus=(-info "FOCUS=$FOCUS: the suite's own report below counts every test outside the focus as passed (its Run takes t.Run's true for a test that -run filtered out)")
  "$tmp/cnp-report" "${report_args[@]}" -junit "$out/junit.xml" \
    -title "ClusterNetworkPolicy conformance (sigs.k8s.io/network-policy-api v0.3.0)" \
    -info "Versions: network-policy-api v0.3.0 (suite and CRD, standard channel), $(go env GOVERSION), flatnet $flatnet_version, kernel $(uname -r)" \
    -info "Command: \`PHASES=cnp hack/conformance.sh\` ($cnp_cmd)" "${focus[@]}" || return 1
  [ "$grc" = 0 ]
}

# run_gateway: the Gateway API suite (test/gateway) in the external
# host's network namespace (setns on the net namespace only: files, the
# kubeconfig and the lab's apiserver at the underlay's .1 are all there),
# its events to $raw/events.json as for cnp.
run_gateway() {
  local netns=/run/netns/fl-$name-ext
  [ -e "$netns" ] || die "no $netns: the lab has no external host (lab up --external)"
  local args=(-test.v=test2json -test.count=1 "-test.timeout=$timeout" -test.run='^TestGatewayAPIConformance$'
    "-report-output=$raw/report.yaml" "-flatnet-version=$flatnet_version")
  [ -z "${FOCUS:-}" ] || args+=("-run-test=$FOCUS")
  [ -z "${GATEWAY_SKIP:-}" ] || args+=("-skip-tests=$GATEWAY_SKIP")
  # shellcheck disable=SC2206 # GATEWAY_ARGS is words on purpose
  args+=(${GATEWAY_ARGS:-})
  gateway_cmd="KUBECONFIG=<lab> nsenter --net=$netns go test ./test/gateway -args ${args[*]}"
  say "phase gateway: Gateway API v1.6.3 conformance, GatewayClass flatnet, profile GATEWAY-HTTP, from netns fl-$name-ext (log: $log)"
  start_runner "$tmp/gateway.test" "$netns" "${args[@]}"
}

# report_gateway EXIT: summary.md and the suite's report.yaml of the
# gateway phase.
report_gateway() {
  local grc=$1
  runner_exited "$grc" ", the suite run from the external host's netns fl-$name-ext"
  local focus=()
  [ -z "${FOCUS:-}" ] || focus=(-info "FOCUS=$FOCUS: only that test ran (the suite's -run-test); the suite's report counts the others as skipped")
  "$tmp/gateway-report" "${report_args[@]}" \
    -title "Gateway API conformance (sigs.k8s.io/gateway-api v1.6.3), profile GATEWAY-HTTP" \
    -info "Versions: gateway-api v1.6.3 (suite, standard-channel CRDs, echo-basic built from its source), $(go env GOVERSION), flatnet $flatnet_version, kernel $(uname -r)" \
    -info "Command: \`PHASES=gateway hack/conformance.sh\` ($gateway_cmd)" "${focus[@]}" || return 1
  [ "$grc" = 0 ]
}

flatnet_version=$(git describe --tags --always --dirty 2>/dev/null || echo dev)
rc=0
for phase in $phases; do
  f=${FOCUS:-$(focus "$phase")}
  # The phase's own skips (what other phases run, SKIP) on top of the list.
  x=$(extra_skip "$phase")
  [ -z "${SKIP:-}" ] || x=${x:+$x|}$SKIP
  s=$skip${x:+|$x}
  out=$reports/$phase
  # Absolute: ginkgo runs e2e.test in the binary's own directory.
  raw=$PWD/_output/conformance/$phase
  rm -rf "$out" "$raw"
  mkdir -p "$out" "$raw"
  log=$raw/ginkgo.log
  if [ "$phase" = cnp ]; then
    log=$raw/cnp.log
    t0=$SECONDS
    run_cnp
  elif [ "$phase" = gateway ]; then
    log=$raw/gateway.log
    t0=$SECONDS
    run_gateway
  else
    args=(--provider=local "--kubeconfig=$kubeconfig" "--kubectl-path=$k8sbin/kubectl"
      --dns-domain=cluster.local "--num-nodes=$nodes" "--report-dir=$raw" --disable-log-dump
      "--ginkgo.focus=$f" "--ginkgo.skip=$s")
    say "phase $phase: ginkgo -p --procs=$procs e2e.test --ginkgo.focus='$f' (log: $log)"
    t0=$SECONDS
    # setsid: ginkgo leads a process group of its own (a background job of
    # a script is no group leader, so setsid execs it without forking).
    KUBERNETES_CONFORMANCE_TEST=y setsid "$k8sbin/ginkgo" -p "--procs=$procs" "--timeout=$timeout" --no-color --silence-skips \
      "$k8sbin/e2e.test" -- "${args[@]}" > >(tee "$log") 2>&1 &
  fi
  current=$!
  set +e
  wait "$current"
  grc=$?
  current=
  set -e
  report_phase "$grc" || rc=1
done
say "reports in $reports/{${phases// /,}}/summary.md"
exit "$rc"
