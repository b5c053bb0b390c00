#!/usr/bin/env bash
# make demo: installs what it needs, builds flatnet and the upstream
# control plane, brings up a 3-node lab, starts a netexec pod on every
# node and shows pod-to-pod traffic across nodes (with the client's own
# IP seen by the server: no NAT), then a Service answered by the pods of
# every node through its ClusterIP and its NodePort. The lab keeps running afterwards.
#
#   LAB_NAME   lab name (default flatnet)
#   NODES      number of nodes (default 3)
#   RUNTIME    what runs the pods: process (default: flatnet's lab runtime,
#              pods are processes of this machine) or containerd (upstream
#              containerd, runc and kubelet per node, images imported
#              offline: builds them with make node images the first time)
set -euo pipefail
cd "$(dirname "$0")/.."
export PATH=/usr/local/go/bin:$PATH

if [ "$(id -u)" != 0 ]; then
  echo "make demo needs root (network namespaces, interfaces): run \`sudo make demo\`" >&2
  exit 1
fi
name=${LAB_NAME:-flatnet}
nodes=${NODES:-3}
runtime=${RUNTIME:-process}
case $runtime in
  process | containerd) ;;
  *) echo "RUNTIME=$runtime: want process or containerd" >&2; exit 1 ;;
esac
flags=()
[ "$name" = flatnet ] || flags=(--name "$name")
lab() { bin/flatnet lab "${flags[@]}" "$@"; }
cmd="bin/flatnet lab${flags[*]:+ ${flags[*]}}"
step() { printf '\n\033[1m== %s\033[0m\n' "$*"; }

step "dependencies (hack/deps.sh)"
hack/deps.sh
step "build bin/flatnet and bin/flatnet-cni (make build)"
make -s build
step "build kube-apiserver, kubectl and etcd (make k8s: minutes the first time, cached after)"
make -s k8s
if [ "$runtime" = containerd ]; then
  step "build the kubelet, containerd, runc and the pods' images (minutes the first time, cached after)"
  hack/build-k8s.sh kubelet
  make -s node images
fi

step "bring up a $nodes-node lab with an external host: flatnet lab up --nodes $nodes --external --runtime $runtime"
lab up --nodes "$nodes" --external --runtime "$runtime"

step "a netexec pod on every node"
mapfile -t node_names < <(lab kubectl -- get nodes -o jsonpath='{range .items[*]}{.metadata.name}{"\n"}{end}')
pods=()
for i in "${!node_names[@]}"; do pods+=("netexec-$((i + 1))"); done
for i in "${!node_names[@]}"; do
  sed -e "s/@NAME@/${pods[i]}/" -e "s/@NODE@/${node_names[i]}/" hack/demo/netexec.yaml
  echo ---
done | lab kubectl -- apply -f -
lab kubectl -- wait --for=condition=Ready pod -l app=netexec --timeout=90s
lab kubectl -- get pods -o wide

ip_of() { lab kubectl -- get pod "$1" -o jsonpath='{.status.podIP}'; }
node_of() { lab kubectl -- get pod "$1" -o jsonpath='{.spec.nodeName}'; }

step "pod to pod across nodes (each pod's netexec /dial asks the next pod)"
n=${#pods[@]}
for ((k = 0; k < n; k++)); do
  a=${pods[k]} b=${pods[(k + 1) % n]}
  ipa=$(ip_of "$a") ipb=$(ip_of "$b")
  echo "-- $a ($ipa on $(node_of "$a")) -> $b ($ipb on $(node_of "$b"))"
  q="protocol=http&host=$ipb&port=8080&tries=1"
  echo "   \$ flatnet lab exec $a -- curl -s 'http://127.0.0.1:8080/dial?request=hostname&$q'"
  echo "   $(lab exec "$a" -- curl -s "http://127.0.0.1:8080/dial?request=hostname&$q")"
  echo "   \$ flatnet lab exec $a -- curl -s 'http://127.0.0.1:8080/dial?request=clientip&$q'"
  ans=$(lab exec "$a" -- curl -s "http://127.0.0.1:8080/dial?request=clientip&$q")
  echo "   $ans"
  case $ans in
    *"\"$ipa:"*) echo "   $b saw $a's own IP $ipa: routed across nodes with no NAT" ;;
    *) echo "   unexpected answer: $b did not see $ipa" >&2; exit 1 ;;
  esac
done

step "a Service: one ClusterIP in front of the netexec pods on every node"
cat <<'YAML' | lab kubectl -- apply -f -
apiVersion: v1
kind: Service
metadata:
  name: netexec
spec:
  type: NodePort
  selector:
    app: netexec
  ports:
  - name: http
    port: 80
    targetPort: 8080
YAML
vip=$(lab kubectl -- get service netexec -o jsonpath='{.spec.clusterIP}')
nodeport=$(lab kubectl -- get service netexec -o jsonpath='{.spec.ports[0].nodePort}')
lab kubectl -- get service netexec
lab kubectl -- get endpointslices -l kubernetes.io/service-name=netexec -o wide
# The EndpointSlice and every node's nftables rules follow within about a
# second; poll until every pod has answered through the ClusterIP.
echo "-- 30 requests from ${pods[0]} to the ClusterIP $vip:80, answered by:"
echo "   \$ flatnet lab exec ${pods[0]} -- curl -s 'http://127.0.0.1:8080/dial?request=hostname&protocol=http&host=$vip&port=80&tries=30'"
seen=""
for _ in $(seq 1 30); do
  ans=$(lab exec "${pods[0]}" -- curl -s "http://127.0.0.1:8080/dial?request=hostname&protocol=http&host=$vip&port=80&tries=30")
  seen=$(grep -o 'netexec-[0-9]*' <<<"$ans" | sort | uniq -c || true)
  [ "$(wc -l <<<"$seen")" -ge "$n" ] && break
  sleep 1
done
echo "$seen" | sed 's/^ */   /'
if [ "$(wc -l <<<"$seen")" -lt "$n" ]; then
  echo "   not every pod answered through the Service: $ans" >&2
  exit 1
fi
echo "   every pod, on every node, answered through one virtual IP"
node1ip=$(lab kubectl -- get node "${node_names[0]}" -o jsonpath='{.status.addresses[?(@.type=="InternalIP")].address}')
echo "-- NodePort $nodeport on ${node_names[0]} ($node1ip), from ${pods[n - 1]}:"
echo "   $(lab exec "${pods[n - 1]}" -- curl -s "http://127.0.0.1:8080/dial?request=hostname&protocol=http&host=$node1ip&port=$nodeport&tries=5")"

step "cluster DNS: the Service by its name (every agent answers on the kube-dns ClusterIP, no DNS pods)"
dnsip=$(lab kubectl -- -n kube-system get service kube-dns -o jsonpath='{.spec.clusterIP}')
echo "-- ${pods[n - 1]}'s /etc/resolv.conf (as the kubelet writes it for dnsPolicy ClusterFirst):"
lab exec "${pods[n - 1]}" -- cat /etc/resolv.conf | sed 's/^/   /'
for name in netexec netexec.default.svc.cluster.local kube-dns.kube-system external.test; do
  echo "   \$ flatnet lab exec ${pods[n - 1]} -- getent hosts $name"
  ans=$(lab exec "${pods[n - 1]}" -- getent hosts "$name") || { echo "   $name did not resolve" >&2; exit 1; }
  echo "   $ans"
done
echo "   \$ flatnet lab exec ${pods[n - 1]} -- curl -s http://netexec/hostname"
ans=$(lab exec "${pods[n - 1]}" -- curl -s -m 5 http://netexec/hostname) || { echo "   curl by name failed" >&2; exit 1; }
echo "   $ans"
echo "   netexec answered by name; kube-dns is $dnsip, served on each node by its agent;"
echo "   external.test came from the lab's external host, the cluster DNS's upstream"

step "L7: a Gateway (class flatnet) and an HTTPRoute in front of the netexec Service, from the external host"
lab kubectl -- apply -f docs/examples/gateway.yaml
lab kubectl -- wait --for=condition=Programmed gateway/web --timeout=60s
gwip=$(lab kubectl -- get gateway web -o jsonpath='{.status.addresses[0].value}')
lab kubectl -- get gateway web
ext=fl-${LAB_NAME:-flatnet}-ext
echo "   \$ ip netns exec $ext curl -si -H 'Host: www.example.com' http://$gwip/hostname"
ans=""
for _ in $(seq 50); do
  ans=$(ip netns exec "$ext" curl -si -m 2 -H 'Host: www.example.com' "http://$gwip/hostname") && [[ $ans == *"200 OK"* ]] && break
  sleep 0.2
done
[[ $ans == *"200 OK"* ]] || { echo "   the Gateway did not answer: $ans" >&2; exit 1; }
printf '%s\n' "$ans" | tr -d '\r' | grep -Ei '^HTTP|^x-served-by' | sed 's/^/   /'
printf '   %s\n' "$(printf '%s' "$ans" | tail -1)"
echo "   the external host reached the pod through the Gateway's LoadBalancer IP: flatnet gateway on the"
echo "   receiving node matched the HTTPRoute and sent it straight to a netexec pod (docs/gateway.md)"

node1=$(lab status | awk '/^NODE/ {getline; print $5; exit}')
cat <<MSG

The lab keeps running. Explore it:
  $cmd status                        nodes, pods, IPs
  $cmd kubectl -- get pods -o wide
  $cmd exec netexec-1 -- ip route    a pod's view
  ip netns exec $node1 nft list table ip flatnet-proxy   a node's Service rules
  ip netns exec $node1 ip route             a node's host-gw routes (one per peer node)
  ip netns exec $node1 nft list table inet flatnet-dns   cluster DNS packets skip conntrack
  $cmd exec netexec-1 -- getent hosts kubernetes    names from the cluster DNS
  export KUBECONFIG=\$($cmd kubeconfig)
Take it down (leaves nothing behind):
  $cmd down
MSG
