#!/usr/bin/env bash
# Times a 3-node lab from `flatnet lab up` to "ready": every node Ready
# (up returns then) and a netexec pod on each node answering the others
# through /dial. Then times `lab down`. Needs root, bin/flatnet (make
# build) and the upstream binaries (make k8s).
#
#   RUNS    number of labs brought up and down one after another (default 3)
#   NODES   nodes per lab (default 3)
#   RUNTIME the lab's --runtime (default process; containerd needs make node,
#           hack/build-k8s.sh kubelet agnhost and the images, built by the
#           first up)
set -euo pipefail
cd "$(dirname "$0")/.."
[ "$(id -u)" = 0 ] || { echo "bench-lab needs root" >&2; exit 1; }
[ -x bin/flatnet ] || { echo "bin/flatnet missing: run make build" >&2; exit 1; }
runs=${RUNS:-3}
nodes=${NODES:-3}
runtime=${RUNTIME:-process}
# Short: real nodes' unix sockets live under it (107 bytes at most).
root=$(mktemp -d /tmp/fbl.XXXXXX)
name=
cleanup() {
  set +e
  [ -z "$name" ] || bin/flatnet lab --state-dir "$root" --name "$name" down >/dev/null 2>&1
  rm -rf "$root"
}
trap cleanup EXIT

now() { date +%s.%N; }
secs() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", b - a }'; }

echo "bench-lab: $runs runs of a $nodes-node lab (runtime $runtime) on $(nproc) cores, $(uname -r); load $(cut -d' ' -f1-3 /proc/loadavg)"
printf '%-4s %10s %14s %10s\n' run "up (s)" "pods+traffic" "down (s)"
for run in $(seq 1 "$runs"); do
  name=b$$r$run
  lab() { bin/flatnet lab --state-dir "$root" --name "$name" "$@"; }
  t0=$(now)
  lab up --nodes "$nodes" --runtime "$runtime" >"$root/up-$run.log" 2>&1 || { cat "$root/up-$run.log"; exit 1; }
  t1=$(now)
  for i in $(seq 1 "$nodes"); do
    sed -e "s/@NAME@/netexec-$i/" -e "s/@NODE@/$name-node$i/" hack/demo/netexec.yaml
    echo ---
  done | lab kubectl -- apply -f - >/dev/null
  # Every pod answers every other one through its /dial.
  declare -A ip=()
  deadline=$(( $(date +%s) + 120 ))
  while :; do
    ok=1
    for i in $(seq 1 "$nodes"); do
      [ -n "${ip[$i]-}" ] || ip[$i]=$(lab kubectl -- get pod "netexec-$i" -o jsonpath='{.status.podIP}' 2>/dev/null || true)
      [ -n "${ip[$i]}" ] || { ok=0; break; }
    done
    if [ $ok = 1 ]; then
      for i in $(seq 1 "$nodes"); do
        for j in $(seq 1 "$nodes"); do
          [ "$i" != "$j" ] || continue
          ans=$(ip netns exec "fl-$name-n$i" curl -s --max-time 2 \
            "http://${ip[$i]}:8080/dial?request=hostname&protocol=http&host=${ip[$j]}&port=8080&tries=1" || true)
          [[ $ans == *"netexec-$j"* ]] || { ok=0; break 2; }
        done
      done
    fi
    [ $ok = 1 ] && break
    [ "$(date +%s)" -lt "$deadline" ] || { echo "pods not reachable after 120s" >&2; lab status >&2; exit 1; }
    sleep 0.1
  done
  unset ip
  t2=$(now)
  lab down >"$root/down-$run.log" 2>&1 || { cat "$root/down-$run.log"; exit 1; }
  t3=$(now)
  name=
  printf '%-4s %10s %14s %10s\n' "$run" "$(secs "$t0" "$t1")" "$(secs "$t0" "$t2")" "$(secs "$t2" "$t3")"
done
echo "up: lab up until all nodes Ready; pods+traffic: from lab up's start until a pod on each node answers every other pod"
