package main

import (
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/vishvananda/netlink"

	"github.com/flatnet/flatnet/internal/netlinkx"
	"github.com/flatnet/flatnet/internal/netns"
)

// Ports every pod maps (see CapabilityArgs); they must appear in the host
// netns ruleset after ADD and be gone after DEL.
var benchHostPorts = []string{"18080", "18053"}

// hostState is what the bench host netns holds at one moment.
type hostState struct {
	links   []string
	ruleset string
	rules   int // rule lines in `nft list ruleset` (iptables-nft rules included)
}

// inHost runs fn inside the bench host netns.
func (b *bench) inHost(fn func() error) error { return netns.Do(b.hostPath, fn) }

func (b *bench) hostState() (hostState, error) {
	var st hostState
	err := b.inHost(func() error {
		var err error
		if st.links, err = linkNames(); err != nil {
			return err
		}
		// exec from the locked thread: nft runs in the bench host netns.
		out, err := exec.Command("nft", "list", "ruleset").CombinedOutput()
		if err != nil {
			return fmt.Errorf("nft list ruleset in %s: %v: %s", b.hostNS, err, out)
		}
		st.ruleset = string(out)
		st.rules = countRules(st.ruleset)
		return nil
	})
	if err != nil {
		return st, fmt.Errorf("reading bench host netns: %w", err)
	}
	return st, nil
}

// countRules counts the rule lines of an `nft list ruleset` dump: lines
// that are not table/chain/set headers, braces, type/policy lines or
// blank.
func countRules(dump string) int {
	n := 0
	for _, l := range strings.Split(dump, "\n") {
		l = strings.TrimSpace(l)
		switch {
		case l == "", l == "}", strings.HasPrefix(l, "table "), strings.HasPrefix(l, "chain "),
			strings.HasPrefix(l, "set "), strings.HasPrefix(l, "map "), strings.HasPrefix(l, "type "),
			strings.HasPrefix(l, "flags "), strings.HasPrefix(l, "elements "), strings.HasPrefix(l, "policy "),
			strings.HasPrefix(l, "#"):
			continue
		}
		n++
	}
	return n
}

// linkNames lists the links of the calling thread's netns but for parked
// ones: DEL parks a pod's links (down, for a collector), they are
// counted in parkedLinks and collected at the end (finalChecks).
func linkNames() ([]string, error) {
	links, err := netlinkx.LinkList()
	if err != nil {
		return nil, err
	}
	var names []string
	for _, l := range links {
		if !netlinkx.IsParked(l) {
			names = append(names, l.Attrs().Name)
		}
	}
	slices.Sort(names)
	return names, nil
}

// parkedLinks counts the parked links of the calling thread's netns.
func parkedLinks() (int, error) {
	links, err := netlinkx.LinkList()
	n := 0
	for _, l := range links {
		if netlinkx.IsParked(l) {
			n++
		}
	}
	return n, err
}

// verifyAdd checks, outside the timed region, that ADD really did its
// work: the pod's address on eth0, the host veth on the bridge with a
// shaping qdisc and an ingress hook (bandwidth), and the port mappings in
// the host netns ruleset (portmap).
func (b *bench) verifyAdd(res types.Result, ctrPath, containerID string) error {
	r, err := current.NewResultFromResult(res)
	if err != nil {
		return fmt.Errorf("ADD result: %w", err)
	}
	if len(r.IPs) == 0 {
		return fmt.Errorf("ADD result has no IPs")
	}
	want := r.IPs[0].Address.IP
	if !b.subnet.Contains(mustAddr(want)) {
		return fmt.Errorf("ADD result IP %s is not in %s", want, b.subnet)
	}
	if err := netns.Do(ctrPath, func() error {
		l, err := netlinkx.LinkByName("eth0")
		if err != nil {
			return fmt.Errorf("eth0 in container netns: %w", err)
		}
		addrs, err := netlinkx.AddrList(l, netlink.FAMILY_V4)
		if err != nil {
			return err
		}
		for _, a := range addrs {
			if a.IP.Equal(want) {
				return nil
			}
		}
		return fmt.Errorf("eth0 in container netns lacks %s (has %v)", want, addrs)
	}); err != nil {
		return err
	}
	var hostSide []string
	for _, i := range r.Interfaces {
		if i.Sandbox == "" && i.Name != b.bridge {
			hostSide = append(hostSide, i.Name)
		}
	}
	return b.inHost(func() error {
		br, err := netlinkx.LinkByName(b.bridge)
		if err != nil {
			return fmt.Errorf("bridge %s: %w", b.bridge, err)
		}
		// The result also lists bandwidth's IFB; the host veth is the
		// host-side veth enslaved to the bridge.
		var l netlink.Link
		for _, n := range hostSide {
			c, err := netlinkx.LinkByName(n)
			if err == nil && c.Type() == "veth" && c.Attrs().MasterIndex == br.Attrs().Index {
				l = c
			}
		}
		if l == nil {
			return fmt.Errorf("ADD result lists no host-side veth on bridge %s (host-side interfaces: %v)", b.bridge, hostSide)
		}
		hostVeth := l.Attrs().Name
		qs, err := netlinkx.QdiscList(l)
		if err != nil {
			return err
		}
		var kinds []string
		shaping, ingress := false, false
		for _, q := range qs {
			k := q.Type()
			kinds = append(kinds, k)
			switch k {
			case "tbf", "htb", "hfsc", "cake":
				shaping = true
			case "ingress", "clsact":
				ingress = true
			}
		}
		if !shaping || !ingress {
			return fmt.Errorf("bandwidth: host veth %s has qdiscs %v; want a shaping root (tbf/htb) and an ingress hook", hostVeth, kinds)
		}
		out, err := exec.Command("nft", "list", "ruleset").CombinedOutput()
		if err != nil {
			return fmt.Errorf("nft list ruleset: %v: %s", err, out)
		}
		for _, p := range benchHostPorts {
			if !strings.Contains(string(out), p) {
				return fmt.Errorf("portmap: no rule mentions hostPort %s in the bench host netns ruleset", p)
			}
		}
		return nil
	})
}

// leaks lists what a pod left behind after its DEL.
func (b *bench) leaks(s *set, before hostState, ctrPath, containerID string) []string {
	var out []string
	if err := netns.Do(ctrPath, func() error {
		names, err := linkNames()
		if err != nil {
			return err
		}
		for _, n := range names {
			if n != "lo" {
				out = append(out, fmt.Sprintf("container netns still has %s after DEL", n))
			}
		}
		return nil
	}); err != nil {
		out = append(out, fmt.Sprintf("reading container netns: %v", err))
	}
	after, err := b.hostState()
	if err != nil {
		return append(out, err.Error())
	}
	for _, n := range after.links {
		if n != b.bridge && !slices.Contains(before.links, n) {
			out = append(out, fmt.Sprintf("bench host netns gained interface %s (ADD+DEL)", n))
		}
	}
	if strings.Contains(after.ruleset, containerID) {
		out = append(out, fmt.Sprintf("ruleset still mentions container %s after DEL", containerID))
	}
	for _, p := range benchHostPorts {
		if strings.Contains(after.ruleset, p) && !strings.Contains(before.ruleset, p) {
			out = append(out, fmt.Sprintf("ruleset still maps hostPort %s after DEL", p))
		}
	}
	// A set's first pod may create persistent base chains; later pods must
	// not grow the ruleset.
	if b.seen[s] && after.rules > before.rules {
		out = append(out, fmt.Sprintf("ruleset grew by %d rule lines over ADD+DEL", after.rules-before.rules))
	}
	b.seen[s] = true
	return out
}

// snapshot is what cnibench may not change in the root namespace.
type snapshot struct {
	links, addrs, routes, nftTables []string
	ipForward                       string
	ours                            []string // netns named with our prefix
}

func takeSnapshot(prefix string) (snapshot, error) {
	var s snapshot
	var err error
	if s.links, err = linkNames(); err != nil {
		return s, err
	}
	addrs, err := netlinkx.AddrList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return s, err
	}
	for _, a := range addrs {
		s.addrs = append(s.addrs, fmt.Sprintf("%d:%s", a.LinkIndex, a.IPNet))
	}
	routes, err := netlinkx.RouteList(nil, netlink.FAMILY_ALL)
	if err != nil {
		return s, err
	}
	for _, r := range routes {
		s.routes = append(s.routes, fmt.Sprintf("%d:%v:%v", r.LinkIndex, r.Dst, r.Gw))
	}
	if out, err := exec.Command("nft", "list", "tables").Output(); err == nil {
		s.nftTables = strings.Split(strings.TrimSpace(string(out)), "\n")
	}
	if v, err := os.ReadFile("/proc/sys/net/ipv4/ip_forward"); err == nil {
		s.ipForward = strings.TrimSpace(string(v))
	}
	if ents, err := os.ReadDir(netns.RunDir); err == nil {
		for _, e := range ents {
			if strings.HasPrefix(e.Name(), prefix) {
				s.ours = append(s.ours, e.Name())
			}
		}
	}
	for _, l := range [][]string{s.links, s.addrs, s.routes, s.nftTables} {
		slices.Sort(l)
	}
	return s, nil
}

// diff describes how b differs from a, or "" when it does not.
func (a snapshot) diff(b snapshot) string {
	var d []string
	cmpList := func(what string, x, y []string) {
		for _, v := range y {
			if !slices.Contains(x, v) {
				d = append(d, fmt.Sprintf("%s +%s", what, v))
			}
		}
		for _, v := range x {
			if !slices.Contains(y, v) {
				d = append(d, fmt.Sprintf("%s -%s", what, v))
			}
		}
	}
	cmpList("link", a.links, b.links)
	cmpList("addr", a.addrs, b.addrs)
	cmpList("route", a.routes, b.routes)
	cmpList("nft", a.nftTables, b.nftTables)
	cmpList("netns", a.ours, b.ours)
	if a.ipForward != b.ipForward {
		d = append(d, fmt.Sprintf("ip_forward %s -> %s", a.ipForward, b.ipForward))
	}
	return strings.Join(d, "; ")
}

// preloadRules loads n nat rules into an unreferenced chain of the calling
// thread's netns with one iptables-restore, to model a node whose ruleset
// is not empty (iptables-nft reads the table on every invocation). The
// addresses are never routed anywhere: the rules only take up space.
func preloadRules(n int) error {
	var sb strings.Builder
	sb.WriteString("*nat\n:FNBENCH-LOAD - [0:0]\n")
	for i := 0; i < n; i++ {
		fmt.Fprintf(&sb, "-A FNBENCH-LOAD -d 10.255.%d.%d/32 -p tcp -m tcp --dport 80 -m comment --comment \"bench load %d\" -j RETURN\n", i/250, i%250+1, i)
	}
	sb.WriteString("COMMIT\n")
	cmd := exec.Command("iptables-restore", "--noflush")
	cmd.Stdin = strings.NewReader(sb.String())
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("iptables-restore: %v: %s", err, out)
	}
	return nil
}
