package lab

import (
	"encoding/json"
	"net/netip"
	"slices"
	"strings"
	"testing"

	"github.com/flatnet/flatnet/internal/lab/simnodes"
)

func simOpts(nodes, simulated int) Options {
	o := opts("sim", nodes)
	o.SimulatedNodes = simulated
	return o
}

// A lab with simulated nodes records them and their range, and its
// record reads back (parseRecord rebuilds the Spec from its options).
func TestSimulatedSpec(t *testing.T) {
	s, err := NewSpec(simOpts(1, 20), DefaultUnderlay("sim"))
	if err != nil {
		t.Fatal(err)
	}
	if s.SimulatedNodes != 20 || s.SimulatedNodeRange != simnodes.DefaultIPRange {
		t.Errorf("spec: %d simulated nodes in %s", s.SimulatedNodes, s.SimulatedNodeRange)
	}
	b, err := json.Marshal(record{Spec: *s})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := parseRecord(b, "sim"); err != nil {
		t.Errorf("record with simulated nodes: %v", err)
	}
	// Without simulated nodes, no range (a lab recorded before them reads
	// back unchanged).
	if s, _ := NewSpec(simOpts(1, 0), DefaultUnderlay("sim")); s.SimulatedNodeRange.IsValid() {
		t.Errorf("no simulated nodes, range %s", s.SimulatedNodeRange)
	}
	// The real node has the range on-link on eth0, as the service CIDR.
	e := s.nodeEndpoint(s.Nodes[0])
	if !slices.ContainsFunc(e.routes, func(r route) bool { return r.equal(onEth0(simnodes.DefaultIPRange)) }) {
		t.Errorf("node routes %v lack %s on-link on eth0", e.routes, simnodes.DefaultIPRange)
	}
	// The control plane is sized for them.
	cp := controlPlaneConfig(s, "")
	if !cp.ManyNodes || cp.NodeMonitorGracePeriod != simnodes.NodeMonitorGracePeriod || !slices.Equal(cp.DisabledControllers, []string{"endpointslice-controller", "ttl-controller", "endpoints-controller"}) {
		t.Errorf("control plane with simulated nodes: %+v", cp)
	}
	if cp := controlPlaneConfig(&Spec{}, ""); cp.ManyNodes || cp.NodeMonitorGracePeriod != 0 || slices.Contains(cp.DisabledControllers, "ttl-controller") || slices.Contains(cp.DisabledControllers, "endpoints-controller") {
		t.Errorf("control plane without simulated nodes: %+v", cp)
	}
}

func TestSimulatedSpecErrors(t *testing.T) {
	for _, c := range []struct {
		name string
		mod  func(*Options)
		want []string
	}{
		{"cluster CIDR too small", func(o *Options) { o.SimulatedNodes = 300 },
			[]string{"--cluster-cidr 10.244.0.0/16 holds 256 node subnets of /24", "--nodes 1 plus --simulated-nodes 300", "10.128.0.0/11 holds 8,192"}},
		{"range too small", func(o *Options) { o.SimulatedNodes = 10; o.SimulatedNodeRange = "10.252.0.0/29" },
			[]string{"--simulated-node-range 10.252.0.0/29 holds 6 node addresses"}},
		{"range in the cluster CIDR", func(o *Options) { o.SimulatedNodes = 10; o.SimulatedNodeRange = "10.244.128.0/20" },
			[]string{"simulated node range 10.244.128.0/20", "cluster CIDR 10.244.0.0/16"}},
		{"negative", func(o *Options) { o.SimulatedNodes = -1 }, []string{"--simulated-nodes -1"}},
	} {
		t.Run(c.name, func(t *testing.T) {
			o := simOpts(1, 0)
			c.mod(&o)
			_, err := NewSpec(o, DefaultUnderlay("sim"))
			for _, w := range c.want {
				if err == nil || !strings.Contains(err.Error(), w) {
					t.Errorf("error %v, want one saying %q", err, w)
				}
			}
		})
	}
	// 255 simulated and 1 real fill a /16 of /24s exactly.
	if _, err := NewSpec(simOpts(1, 255), DefaultUnderlay("sim")); err != nil {
		t.Errorf("256 node subnets for 256 nodes: %v", err)
	}
	// The range must not be one this machine uses.
	o := simOpts(1, 10)
	o.SimulatedNodeRange = "192.0.2.0/24"
	_, err := resolve(Request{Options: o, Changed: map[string]bool{}}, nil, []netip.Prefix{netip.MustParsePrefix("192.0.2.0/24")}, nil)
	if err == nil || !strings.Contains(err.Error(), "--simulated-node-range") {
		t.Errorf("range on this machine: %v", err)
	}
}

// A running lab grows and shrinks its simulated nodes; their range stays
// while any exist.
func TestResolveSimulated(t *testing.T) {
	recorded, err := NewSpec(simOpts(1, 20), DefaultUnderlay("sim"))
	if err != nil {
		t.Fatal(err)
	}
	req := func(o Options, changed ...string) Request {
		r := Request{Options: o, Changed: map[string]bool{}}
		for _, c := range changed {
			r.Changed[c] = true
		}
		return r
	}
	if s, err := resolve(req(simOpts(3, 5), "simulated-nodes"), recorded, nil, nil); err != nil || s.SimulatedNodes != 5 || len(s.Nodes) != 1 {
		t.Errorf("shrink to 5: %v, %v", s, err)
	}
	if s, err := resolve(req(simOpts(1, 0)), recorded, nil, nil); err != nil || s.SimulatedNodes != 20 {
		t.Errorf("flag unset: %v, %v; want the recorded 20", s, err)
	}
	o := simOpts(1, 20)
	o.SimulatedNodeRange = "10.253.0.0/16"
	if _, err := resolve(req(o, "simulated-node-range"), recorded, nil, nil); err == nil || !strings.Contains(err.Error(), "--simulated-nodes 0") {
		t.Errorf("another range under running simulated nodes: %v", err)
	}
	none, _ := NewSpec(simOpts(1, 0), DefaultUnderlay("sim"))
	if s, err := resolve(req(o, "simulated-nodes", "simulated-node-range"), none, nil, nil); err != nil || s.SimulatedNodeRange.String() != "10.253.0.0/16" {
		t.Errorf("first simulated nodes in a range of choice: %v, %v", s, err)
	}
}

// kwok starts before the simulated nodes are made and stops after they
// are deleted; a lab that never had any has neither step.
func TestPlanSimulated(t *testing.T) {
	with, _ := NewSpec(simOpts(1, 20), DefaultUnderlay("sim"))
	without, _ := NewSpec(simOpts(1, 0), DefaultUnderlay("sim"))
	for _, c := range []struct {
		name string
		s    *Spec
		o    Observed
		want string
	}{
		{"new", with, Observed{}, "+ready +kwok +simulated"},
		{"kwok runs", with, Observed{Kwok: true, SimulatedNodes: 20}, "+ready =kwok +simulated"},
		{"kwok runs with another config", with, Observed{Kwok: true, KwokOutdated: true}, "+ready rkwok +simulated"},
		{"none", without, Observed{}, "+ready"},
		{"down to none", without, Observed{Kwok: true, SimulatedNodes: 20}, "+ready +simulated +kwok"},
		{"down to none, kwok gone", without, Observed{SimulatedNodes: 20}, "+ready +simulated =kwok"},
	} {
		t.Run(c.name, func(t *testing.T) {
			steps := Plan(c.s, c.o)
			var got []string
			for _, st := range steps[len(steps)-len(simulatedSteps(c.s, c.o))-1:] {
				mark := "+"
				if st.Present {
					mark = "="
				} else if st.Restart {
					mark = "r"
				}
				got = append(got, mark+string(st.Kind))
			}
			if g := strings.Join(got, " "); g != c.want {
				t.Errorf("plan ends %s, want %s", g, c.want)
			}
		})
	}
}
