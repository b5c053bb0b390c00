package lab

import (
	"bytes"
	"errors"
	"net/netip"
	"strings"
	"testing"
)

func TestStatusPrint(t *testing.T) {
	s, err := NewSpec(opts("flatnet", 2), DefaultUnderlay("flatnet"))
	if err != nil {
		t.Fatal(err)
	}
	st := &Status{
		Spec: s, K8sBinDir: "/k8s", Underlay: true, Server: "https://10.250.0.1:6443",
		APIServerPID: 20, EtcdPID: 10, ControlPlane: true, Controller: 30,
		Nodes: []NodeStatus{
			{Node: s.Nodes[0], Wired: true, Agent: 40, PodCIDR: "10.244.0.0/24", Ready: "True"},
			{Node: s.Nodes[1], Wired: false, PodCIDR: "10.244.1.0/24", Ready: "Unknown"},
		},
		Drift: []string{"node flatnet-node2: route 10.96.0.0/16 dev eth0 in netns fl-flatnet-n2"},
		Pods:  []PodStatus{{Namespace: "default", Name: "netexec-1", Node: "flatnet-node1", IP: "10.244.0.2", Phase: "Running", Ready: "1/1"}},
	}
	var b bytes.Buffer
	st.Print(&b)
	want := `lab flatnet (state /var/lib/flatnet/lab/flatnet)
underlay:      10.250.0.0/24 on bridge fl-flatnet, host 10.250.0.1 (up)
control plane: https://10.250.0.1:6443, kube-apiserver pid 20, etcd pid 10
controller:    pid 30
runtime:       process (flatnet's lab runtime in each agent: pods are processes of this machine)
networks:      cluster 10.244.0.0/16 (/24 per node), services 10.96.0.0/16, backend host-gw
cni:           conflist flatnet: flatnet (bridge, host-local, bandwidth, portmap in one process), flatnet-policy; plugins in /var/lib/flatnet/lab/flatnet/cni-bin

NODE           INTERNAL-IP  POD-CIDR       READY    NETNS                    AGENT
flatnet-node1  10.250.0.11  10.244.0.0/24  True     fl-flatnet-n1            pid 40
flatnet-node2  10.250.0.12  10.244.1.0/24  Unknown  fl-flatnet-n2 (MISSING)  not running

missing in the kernel (` + "`flatnet lab up`" + ` repairs it):
  node flatnet-node2: route 10.96.0.0/16 dev eth0 in netns fl-flatnet-n2

NAMESPACE  POD        NODE           IP          PHASE    READY
default    netexec-1  flatnet-node1  10.244.0.2  Running  1/1
`
	if got := b.String(); got != want {
		t.Errorf("got:\n%s\nwant:\n%s", got, want)
	}

	st.APIError = errors.New("the control plane is not running")
	st.ControlPlane, st.Server, st.Pods = false, "", nil
	b.Reset()
	st.Print(&b)
	if !bytes.Contains(b.Bytes(), []byte("control plane: not running (kube-apiserver pid 20, etcd pid 10)")) ||
		!bytes.Contains(b.Bytes(), []byte("pods: cannot read the API: the control plane is not running")) {
		t.Errorf("control plane down:\n%s", b.String())
	}
}

func TestStatusPrintTwoSubnets(t *testing.T) {
	s, err := NewSpec(twoSubnetOpts("flatnet", 2), netip.MustParsePrefix("10.250.0.0/24"), netip.MustParsePrefix("10.250.1.0/24"))
	if err != nil {
		t.Fatal(err)
	}
	s.CNIConflist = "classic"
	st := &Status{Spec: s, Underlay: true, Router: true, External: true, ExternalPID: 50, APIError: errors.New("down"),
		Nodes: []NodeStatus{{Node: s.Nodes[0], Wired: true, Ready: "-"}, {Node: s.Nodes[1], Wired: true, Ready: "-"}}}
	var b bytes.Buffer
	st.Print(&b)
	for _, want := range []string{
		"underlay 2:    10.250.1.0/24 on bridge underlay2 in netns fl-flatnet-rt, router 10.250.0.254 <-> 10.250.1.1 (up)\n",
		"external host: 10.250.0.250 in netns fl-flatnet-ext (up), netexec HTTP :8080, UDP :8081, pid 50\n",
		"backend vxlan\n",
		"cni:           conflist classic: bridge (host-local), bandwidth, portmap, flatnet-policy; plugins in /var/lib/flatnet/lab/flatnet/cni-bin\n",
		"flatnet-node2  10.250.1.12",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("status lacks %q:\n%s", want, b.String())
		}
	}
	// Plugins from another dir (lab up --cni-bin-dir), then the lab's.
	s.CNIPluginDir = "/opt/ref-cni"
	b.Reset()
	st.Print(&b)
	if want := "plugins in /opt/ref-cni, then /var/lib/flatnet/lab/flatnet/cni-bin (--cni-bin-dir)\n"; !strings.Contains(b.String(), want) {
		t.Errorf("status lacks %q:\n%s", want, b.String())
	}
}
