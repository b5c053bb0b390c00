package simnodes

// kwok's configuration: its options and flatnet's own Stages. kwok
// (v0.8.0) plays a Stage when its selector (jq expressions over the
// object) matches, after its delay; `next` patches the status with the
// rendered statusTemplate (a strategic merge: lists keyed by type, such
// as conditions and addresses, keep the entries the template leaves
// out), or deletes the object. Template functions are kwok's: Now, Quote,
// YAML, NodeIPsWith (the node's InternalIPs), PodIPsWith (the next free
// address of the node's spec.podCIDRs; kwok's pool, in memory, starts at
// .1 and has no upper bound: keep pods per node under MaxPodsPerNode).
//
// Node health without leases: kwok renews no Lease
// (--node-lease-duration-seconds=0; at 5,000 nodes, renewals every 10 s
// are 500 writes/s), so kube-controller-manager's node lifecycle controller
// sees a simulated node's health only in its Ready condition's
// lastHeartbeatTime. The lab gives kube-controller-manager
// NodeMonitorGracePeriod, and the heartbeat Stage rewrites the conditions
// every HeartbeatInterval (plus up to as much jitter), far inside it: a few
// writes per second at 5,000 nodes, and nodes that stay Ready however long
// the lab runs.

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/flatnet/flatnet/internal/lab/controlplane"
)

// KwokVersion is the sigs.k8s.io/kwok version hack/kwok/go.mod pins;
// hack/build-kwok.sh builds it into a directory named after it. A test
// keeps the two in step.
const KwokVersion = "v0.8.0"

const (
	// HeartbeatInterval is the heartbeat Stage's delay (its jitter adds
	// up to as much again).
	HeartbeatInterval = 30 * time.Minute
	// NodeMonitorGracePeriod is kube-controller-manager's
	// --node-monitor-grace-period in a lab with simulated nodes: longer
	// than two heartbeats, so a busy kwok never lets a node go Unknown.
	// Real nodes of that lab are marked Unknown that late too.
	NodeMonitorGracePeriod = 2 * time.Hour
)

// ErrNoKwok is returned (wrapped) when the kwok binary is not built.
var ErrNoKwok = errors.New("kwok binary missing")

// KwokBinary is where hack/build-kwok.sh puts kwok:
// ${FLATNET_CACHE:-$HOME/.cache/flatnet}/kwok-<version>/bin/kwok. It
// returns ErrNoKwok, naming the command that builds it, when it is not
// there.
func KwokBinary() (string, error) {
	k8sBin, err := controlplane.CacheBinDir()
	if err != nil {
		return "", err
	}
	p := filepath.Join(filepath.Dir(filepath.Dir(k8sBin)), "kwok-"+KwokVersion, "bin", "kwok")
	if st, err := os.Stat(p); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
		return "", fmt.Errorf("%w: %s not found: run `make kwok` (hack/build-kwok.sh builds kwok %s from the Go module proxy; about a minute the first time)",
			ErrNoKwok, p, KwokVersion)
	}
	return p, nil
}

// KwokArgv is kwok's command line: the lab's admin kubeconfig, the config
// file KwokConfig wrote, only the nodes with AnnotationKwok, no leases.
// kwok serves nothing (no --server-address, no --node-port).
func KwokArgv(bin, kubeconfig, configFile string) []string {
	return []string{
		bin,
		"--kubeconfig=" + kubeconfig,
		"--config=" + configFile,
		"--manage-nodes-with-annotation-selector=" + AnnotationKwok + "=" + KwokValue,
		// Not in the file: there 0 is taken as unset and defaulted to
		// 40; the flag's 0 is kept.
		"--node-lease-duration-seconds=0",
	}
}

// MaxPodsPerNode is how many pods fit a node's podCIDR of prefix length
// mask: its addresses but the network address, .1 (kwok's pool starts
// there; on real nodes the bridge's gateway) and the broadcast address.
func MaxPodsPerNode(mask int) int {
	if mask >= 30 {
		return 1
	}
	return 1<<(32-mask) - 3
}

// KwokConfig is kwok's config file: options and flatnet's Stages
// (node ready, node heartbeat, pod ready, pod delete). maxPods is each
// node's pods capacity (MaxPodsPerNode).
func KwokConfig(maxPods int) []byte {
	r := strings.NewReplacer(
		"@MAXPODS@", strconv.Itoa(maxPods),
		"@HEARTBEAT_MS@", strconv.FormatInt(HeartbeatInterval.Milliseconds(), 10),
		"@KUBELET@", "kwok-"+KwokVersion,
		"@ANNOTATION@", AnnotationKwok+"="+KwokValue,
	)
	return []byte(r.Replace(kwokConfig))
}

// nodeConditions is the conditions part of a node Stage's statusTemplate
// (with $now and $since defined): Ready, no pressure, its network
// available (flatnet's agents set NetworkUnavailable on real nodes; nobody
// would on these).
var nodeConditions = func() string {
	var b strings.Builder
	b.WriteString("\n      conditions:\n")
	for _, c := range [][3]string{
		{"Ready", "True", "KubeletReady"},
		{"MemoryPressure", "False", "KubeletHasSufficientMemory"},
		{"DiskPressure", "False", "KubeletHasNoDiskPressure"},
		{"PIDPressure", "False", "KubeletHasSufficientPID"},
		{"NetworkUnavailable", "False", "FlatnetSimulated"},
	} {
		fmt.Fprintf(&b, "      - type: %s\n        status: %q\n        reason: %s\n        message: \"simulated by kwok for flatnet\"\n"+
			"        lastHeartbeatTime: {{ $now | Quote }}\n        lastTransitionTime: {{ $since | Quote }}\n", c[0], c[1], c[2])
	}
	return b.String()
}()

// stage is one kwok Stage named name, for objects of kind (Node or Pod)
// matching every one of exprs (jq expression, operator, values), then
// spec, the rest of its spec (delay, next, ...), indented by two spaces.
func stage(comment, name, kind string, exprs [][3]string, spec string) string {
	var b strings.Builder
	fmt.Fprintf(&b, "---\n%sapiVersion: kwok.x-k8s.io/v1alpha1\nkind: Stage\nmetadata:\n  name: %s\nspec:\n  resourceRef:\n    apiGroup: v1\n    kind: %s\n  selector:\n    matchExpressions:\n",
		comment, name, kind)
	for _, e := range exprs {
		fmt.Fprintf(&b, "    - key: '%s'\n      operator: '%s'\n", e[0], e[1])
		if e[2] != "" {
			fmt.Fprintf(&b, "      values: ['%s']\n", e[2])
		}
	}
	b.WriteString(spec)
	return b.String()
}

// Selector expressions of the Stages.
const (
	readyStatus = `.status.conditions.[] | select( .type == "Ready" ) | .status`
	deletion    = ".metadata.deletionTimestamp"
)

var kwokConfig = `apiVersion: config.kwok.x-k8s.io/v1alpha1
kind: KwokConfiguration
options:
  manageNodesWithAnnotationSelector: "@ANNOTATION@"
  nodePlayStageParallelism: 8
  podPlayStageParallelism: 8
` + stage(`# A new simulated node becomes Ready. Its status.addresses (its own
# InternalIP, given at creation) are left as they are: the template does
# not name them.
`, "flatnet-node-ready", "Node", [][3]string{{readyStatus, "NotIn", "True"}}, `  next:
    statusTemplate: |
      {{ $now := Now }}
      {{ $since := or .metadata.creationTimestamp $now }}`+nodeConditions+`
      capacity:
        cpu: "32"
        memory: 128Gi
        pods: "@MAXPODS@"
        ephemeral-storage: 1Ti
      allocatable:
        cpu: "32"
        memory: 128Gi
        pods: "@MAXPODS@"
        ephemeral-storage: 1Ti
      nodeInfo:
        architecture: amd64
        operatingSystem: linux
        osImage: "flatnet simulated node"
        kernelVersion: "simulated"
        containerRuntimeVersion: "kwok://@KUBELET@"
        kubeletVersion: "@KUBELET@"
        kubeProxyVersion: "@KUBELET@"
        machineID: ""
        systemUUID: ""
        bootID: ""
      phase: Running
`) + stage(`# A Ready node's conditions are rewritten every heartbeat (see the note at
# the top of kwok.go); playing it again re-arms its delay.
`, "flatnet-node-heartbeat", "Node", [][3]string{{readyStatus, "In", "True"}}, `  delay:
    durationMilliseconds: @HEARTBEAT_MS@
    jitterDurationMilliseconds: @HEARTBEAT_MS@
  next:
    statusTemplate: |
      {{ $now := Now }}
      {{ $since := or .metadata.creationTimestamp $now }}`+nodeConditions+`
  immediateNextStage: true
`) + stage(`# A pod bound to a simulated node runs at once: its containers ready, its
# host IPs the node's InternalIPs, its pod IP the next free address of the
# node's podCIDR (a host-network pod gets the node's IP).
`, "flatnet-pod-ready", "Pod", [][3]string{{deletion, "DoesNotExist", ""}, {".status.phase", "In", "Pending"}, {readyStatus, "NotIn", "True"}}, `  next:
    statusTemplate: |
      {{ $now := Now }}
      conditions:
      {{ range list "PodScheduled" "Initialized" "ContainersReady" "Ready" }}
      - type: {{ . }}
        status: "True"
        lastTransitionTime: {{ $now | Quote }}
      {{ end }}
      {{ range .spec.readinessGates }}
      - type: {{ .conditionType | Quote }}
        status: "True"
        lastTransitionTime: {{ $now | Quote }}
      {{ end }}
      containerStatuses:
      {{ range .spec.containers }}
      - name: {{ .name | Quote }}
        image: {{ .image | Quote }}
        imageID: ""
        ready: true
        started: true
        restartCount: 0
        state:
          running:
            startedAt: {{ $now | Quote }}
      {{ end }}
      {{ with .spec.initContainers }}
      initContainerStatuses:
      {{ range . }}
      - name: {{ .name | Quote }}
        image: {{ .image | Quote }}
        imageID: ""
        ready: true
        restartCount: 0
        state:
          terminated:
            exitCode: 0
            reason: Completed
            startedAt: {{ $now | Quote }}
            finishedAt: {{ $now | Quote }}
      {{ end }}
      {{ end }}
      {{ with NodeIPsWith .spec.nodeName }}
      hostIP: {{ index . 0 | Quote }}
      hostIPs:
      {{ range . }}
      - ip: {{ . | Quote }}
      {{ end }}
      {{ end }}
      {{ with PodIPsWith .spec.nodeName ( or .spec.hostNetwork false ) ( or .metadata.uid "" ) ( or .metadata.name "" ) ( or .metadata.namespace "" ) }}
      podIP: {{ index . 0 | Quote }}
      podIPs:
      {{ range . }}
      - ip: {{ . | Quote }}
      {{ end }}
      {{ end }}
      phase: Running
      startTime: {{ $now | Quote }}
`) + stage(`# A pod being deleted is gone once it has a deletionTimestamp: nothing
# runs to stop (the kubelet's part in a graceful delete).
`, "flatnet-pod-delete", "Pod", [][3]string{{deletion, "Exists", ""}}, `  next:
    delete: true
`)
