package proxy

import (
	"net/netip"
	"slices"
	"testing"
)

// Usable follows kube-proxy: Ready decides, so the terminating endpoints
// of a publishNotReadyAddresses Service (ready by definition) take
// traffic; serving terminating ones only when nothing is ready.
func TestUsable(t *testing.T) {
	ip := func(s string) netip.Addr { return netip.MustParseAddr(s) }
	ready := Endpoint{IP: ip("10.0.0.1"), Ready: true, Serving: true, NodeName: "a"}
	// publishNotReadyAddresses: ready, serving and terminating at once.
	readyTerm := Endpoint{IP: ip("10.0.0.2"), Ready: true, Serving: true, Terminating: true, NodeName: "b"}
	servingTerm := Endpoint{IP: ip("10.0.0.3"), Serving: true, Terminating: true, NodeName: "a"}
	notReady := Endpoint{IP: ip("10.0.0.4"), NodeName: "a"}
	ips := func(eps []Endpoint) []string {
		var out []string
		for _, ep := range eps {
			out = append(out, ep.IP.String())
		}
		return out
	}
	for _, c := range []struct {
		name string
		eps  []Endpoint
		node string
		want []string
	}{
		{"ready ones, terminating or not", []Endpoint{ready, readyTerm, servingTerm, notReady}, "", []string{"10.0.0.1", "10.0.0.2"}},
		{"only a ready terminating one", []Endpoint{readyTerm, servingTerm}, "", []string{"10.0.0.2"}},
		{"none ready: the serving terminating ones", []Endpoint{servingTerm, notReady}, "", []string{"10.0.0.3"}},
		{"node-local", []Endpoint{ready, readyTerm, servingTerm}, "b", []string{"10.0.0.2"}},
		{"nothing", []Endpoint{notReady}, "", nil},
	} {
		if got := ips(Usable(c.eps, c.node)); !slices.Equal(got, c.want) {
			t.Errorf("%s: %v, want %v", c.name, got, c.want)
		}
	}
}

func TestChangesOf(t *testing.T) {
	svcs := []*Service{{Namespace: "a", Name: "x"}, {Namespace: "a", Name: "y"}, {Namespace: "b", Name: "x"}}
	got := ChangesOf(svcs, map[string]bool{"a/y": true, "b/x": true, "c/z": true})
	if c, ok := got["c/z"]; len(got) != 3 || got["a/y"] != svcs[1] || got["b/x"] != svcs[2] || !ok || c != nil {
		t.Fatalf("ChangesOf: %v (want a/y, b/x, and c/z deleted)", got)
	}
}

// HasUsable agrees with Usable on every list of up to two endpoints of
// any readiness on two nodes, for every node asked.
func TestHasUsable(t *testing.T) {
	var one []Endpoint
	for _, nodeName := range []string{"a", "b"} {
		for flags := range 8 {
			one = append(one, Endpoint{IP: netip.MustParseAddr("10.0.0.1"), Port: 80, NodeName: nodeName,
				Ready: flags&1 != 0, Serving: flags&2 != 0, Terminating: flags&4 != 0})
		}
	}
	lists := [][]Endpoint{nil}
	for _, x := range one {
		lists = append(lists, []Endpoint{x})
		for _, y := range one {
			lists = append(lists, []Endpoint{x, y})
		}
	}
	for _, eps := range lists {
		for _, node := range []string{"", "a", "b", "c"} {
			if got, want := HasUsable(eps, node), len(Usable(eps, node)) > 0; got != want {
				t.Errorf("HasUsable(%+v, %q) = %v, want %v", eps, node, got, want)
			}
		}
	}
}
