package e2e

import (
	"encoding/json"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"

	"github.com/flatnet/flatnet/internal/lab"
	"github.com/flatnet/flatnet/internal/testutil"
)

// TestConflistSwitch: a lab's agents write the flatnet plugin type by
// default; `up --cni-conflist classic` restarts them with the classic
// chain and back. Pods made under one style keep talking to pods made
// under the other, serve their hostPort, pass CHECK and are torn down by
// DEL under the other conflist, and are deleted cleanly: no address
// reserved, veth or hostPort rule left.
func TestConflistSwitch(t *testing.T) {
	l := startLab(t, 2)
	s := l.spec
	checkConflistStyle(t, l, "flatnet")
	base := nodeLinks(t, s)

	// Generation a under flatnet, b under classic, c under flatnet again;
	// pod 1 of each serves a hostPort on node 1. Each generation is
	// deleted after the switch that follows it.
	prev, prevPort := l.hostPortPods(t, "a", 18081), 18081
	checkPodToPod(t, prev)
	checkHostPort(t, l, prev[0], prevPort)
	for _, next := range []struct {
		style, was, prefix string
		port               int
	}{{"classic", "flatnet", "b", 18082}, {"flatnet", "classic", "c", 18083}} {
		l.switchConflist(t, next.style, next.was)
		pods := l.hostPortPods(t, next.prefix, int32(next.port))
		checkPodToPod(t, append(slices.Clone(prev), pods...))
		checkHostPort(t, l, prev[0], prevPort)
		checkHostPort(t, l, pods[0], next.port)
		// The previous style's pods pass CHECK under the new conflist,
		// and its DEL takes them down.
		for _, p := range prev {
			if err := cniCheck(t, s, p.node, "default", p.name); err != nil {
				t.Errorf("CHECK under %s of %s, made under %s: %v", next.style, p.name, next.was, err)
			}
		}
		l.deleteClean(t, prev, prevPort, true)
		checkHostPort(t, l, pods[0], next.port)
		prev, prevPort = pods, next.port
	}
	l.deleteClean(t, prev, prevPort, false)

	// Nothing of the six pods is left: every node has the links it had
	// before the first pod, and the bridge.
	after := nodeLinks(t, s)
	for _, n := range s.Nodes {
		want := append(slices.Clone(base[n.Name]), "cni0")
		sort.Strings(want)
		if !slices.Equal(after[n.Name], want) {
			t.Errorf("node %s links after deleting every pod: %v, want %v", n.Name, after[n.Name], want)
		}
		if ips := ipamIPs(t, s, n); len(ips) != 0 {
			t.Errorf("node %s: host-local still holds %v", n.Name, ips)
		}
	}
}

// switchConflist runs `lab up --cni-conflist style` on a lab whose agents
// write was, and waits until every node's conflist is style's.
func (l *testLab) switchConflist(t *testing.T, style, was string) {
	t.Helper()
	out := l.mustCLI(t, "up", "--cni-conflist", style)
	if n := strings.Count(out, "; CNI conflist "+style+", was "+was+" ... done"); n != len(l.spec.Nodes) {
		t.Fatalf("up --cni-conflist %s restarted %d agents, want %d:\n%s", style, n, len(l.spec.Nodes), out)
	}
	if again := l.mustCLI(t, "up", "--cni-conflist", style); strings.Contains(again, "CNI conflist") {
		t.Errorf("a second up --cni-conflist %s restarted agents again:\n%s", style, again)
	}
	checkConflistStyle(t, l, style)
}

// checkConflistStyle waits until every node's conflist has style's
// plugins (flatnet-policy last: the lab's agents run the policy gate),
// and checks that status says so.
func checkConflistStyle(t *testing.T, l *testLab, style string) {
	t.Helper()
	want := map[string][]string{"flatnet": {"flatnet", "flatnet-policy"}, "classic": {"bridge", "bandwidth", "portmap", "flatnet-policy"}}[style]
	for _, n := range l.spec.Nodes {
		var got []string
		if err := retry(60*time.Second, func() error {
			got = conflistTypes(t, l.spec, n)
			if !slices.Equal(got, want) {
				return fmt.Errorf("plugins %v", got)
			}
			return nil
		}); err != nil {
			t.Fatalf("node %s conflist under %s: %v, want %v", n.Name, style, err, want)
		}
	}
	if out := l.mustCLI(t, "status"); !strings.Contains(out, "cni:           conflist "+style+": ") || !strings.Contains(out, "plugins in "+l.spec.CNIBinDir()+"\n") {
		t.Errorf("status does not show conflist %s in %s:\n%s", style, l.spec.CNIBinDir(), out)
	}
}

// conflistTypes are the plugin types of node n's conflist, after
// checking its network name (the same in both styles).
func conflistTypes(t *testing.T, s *lab.Spec, n lab.Node) []string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join(s.CNIConfDir(n), "10-flatnet.conflist"))
	if err != nil {
		return nil
	}
	var list struct {
		Name    string `json:"name"`
		Plugins []struct {
			Type string `json:"type"`
		} `json:"plugins"`
	}
	if err := json.Unmarshal(b, &list); err != nil {
		return nil // being written
	}
	if list.Name != "flatnet" {
		t.Fatalf("node %s conflist network %q, want flatnet", n.Name, list.Name)
	}
	var types []string
	for _, p := range list.Plugins {
		types = append(types, p.Type)
	}
	return types
}

// hostPortPods starts a netexec pod per node, prefix-<index>, the first
// with hostPort on 8080.
func (l *testLab) hostPortPods(t *testing.T, prefix string, hostPort int32) []labPod {
	t.Helper()
	for i, n := range l.spec.Nodes {
		p := netexecPod(prefix+"-"+strconv.Itoa(n.Index), n.Name)
		if i == 0 {
			p.Spec.Containers[0].Ports = []corev1.ContainerPort{{ContainerPort: 8080, HostPort: hostPort, Protocol: corev1.ProtocolTCP}}
		}
		l.create(t, p)
	}
	var pods []labPod
	for _, n := range l.spec.Nodes {
		p := l.waitReady(t, prefix+"-"+strconv.Itoa(n.Index))
		pods = append(pods, labPod{p.Name, p.Status.PodIP, n})
	}
	return pods
}

// checkHostPort: another node reaches p through its node's InternalIP
// and hostPort.
func checkHostPort(t *testing.T, l *testLab, p labPod, hostPort int) {
	t.Helper()
	from := l.spec.Nodes[len(l.spec.Nodes)-1]
	addr := net.JoinHostPort(p.node.IP.String(), strconv.Itoa(hostPort))
	if err := retry(30*time.Second, func() error {
		got, err := httpGet(lab.NetnsPath(from.Netns), addr, "/hostname")
		if err == nil && got != p.name {
			err = fmt.Errorf("answered by %q", got)
		}
		return err
	}); err != nil {
		t.Errorf("node %s -> %s (hostPort of %s): %v", from.Name, addr, p.name, err)
	}
}

// deleteClean deletes pods and checks that nothing of them is left: their
// addresses free in host-local, their host veths gone, no rule for
// hostPort on their nodes. With viaCNI, CNI DEL with the node's current
// conflist takes them down first (as containerd's would, which reads
// it); the runtime's own DEL after it, with the conflist libcni cached at
// their ADD, finds nothing left.
func (l *testLab) deleteClean(t *testing.T, pods []labPod, hostPort int, viaCNI bool) {
	t.Helper()
	before := nodeLinks(t, l.spec)
	var names []string
	for _, p := range pods {
		names = append(names, p.name)
		if !viaCNI {
			continue
		}
		if err := cniDel(t, l.spec, p.node, "default", p.name); err != nil {
			t.Errorf("DEL of %s with %s's conflist: %v", p.name, p.node.Name, err)
		}
	}
	l.deleteAndWait(t, names...)
	for _, p := range pods {
		if ipamIPs(t, l.spec, p.node)[p.ip] {
			t.Errorf("pod %s deleted, its address %s still reserved on %s", p.name, p.ip, p.node.Name)
		}
	}
	// DEL parks a pod's links (internal/cni/parking): the veth goes with
	// the pod's netns, in the kernel's background, and the agent collects
	// the rest every 2 s. So the links go within seconds, not at once.
	linksGone := func(n lab.Node, after map[string][]string) string {
		gone := 0
		for _, link := range before[n.Name] {
			if !slices.Contains(after[n.Name], link) {
				gone++
			}
		}
		onNode := 0
		for _, p := range pods {
			if p.node.Name == n.Name {
				onNode++
			}
		}
		if gone != onNode || len(after[n.Name]) != len(before[n.Name])-onNode {
			return fmt.Sprintf("node %s: deleting %d pods there took links %v to %v", n.Name, onNode, before[n.Name], after[n.Name])
		}
		return ""
	}
	var problems []string
	for deadline := time.Now().Add(15 * time.Second); ; time.Sleep(200 * time.Millisecond) {
		after := nodeLinks(t, l.spec)
		problems = problems[:0]
		for _, n := range l.spec.Nodes {
			if p := linksGone(n, after); p != "" {
				problems = append(problems, p)
			}
		}
		if len(problems) == 0 || time.Now().After(deadline) {
			break
		}
	}
	for _, p := range problems {
		t.Error(p + " (15 s after the deletions)")
	}
	for _, n := range l.spec.Nodes {
		nat := testutil.RunIn(t, lab.NetnsPath(n.Netns), "nft", "list", "ruleset") +
			testutil.RunIn(t, lab.NetnsPath(n.Netns), "iptables-save", "-t", "nat")
		if strings.Contains(nat, strconv.Itoa(hostPort)) {
			t.Errorf("node %s: a rule for hostPort %d is left after deleting its pod:\n%s", n.Name, hostPort, nat)
		}
	}
}

// nodeLinks lists the links of every node namespace by name, sorted.
func nodeLinks(t *testing.T, s *lab.Spec) map[string][]string {
	t.Helper()
	out := map[string][]string{}
	for _, n := range s.Nodes {
		var names []string
		for _, line := range nonEmptyLines(testutil.RunIn(t, lab.NetnsPath(n.Netns), "ip", "-o", "link", "show")) {
			if f := strings.Fields(line); len(f) > 1 {
				names = append(names, strings.TrimSuffix(strings.Split(f[1], "@")[0], ":"))
			}
		}
		sort.Strings(names)
		out[n.Name] = names
	}
	return out
}
