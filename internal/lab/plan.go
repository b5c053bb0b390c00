package lab

import (
	"fmt"
	"strings"
)

// StepKind names one kind of step of `up`, in the order they run.
type StepKind string

// The steps of `up`.
const (
	StepStateDir     StepKind = "state dir"
	StepBin          StepKind = "binaries"
	StepUnderlay     StepKind = "underlay"
	StepNode         StepKind = "node"
	StepControlPlane StepKind = "control plane"
	StepController   StepKind = "controller"
	StepAgent        StepKind = "agent"
	StepReady        StepKind = "ready"
)

// Step is one piece of the lab: Present when the running lab already has
// it, so `up` skips it.
type Step struct {
	Kind    StepKind
	Node    string // for StepNode and StepAgent
	What    string // for people: what this step makes
	Present bool
	// Restart: a process runs but must be restarted (its node namespace
	// was rebuilt under it).
	Restart bool
}

func (s Step) String() string {
	mark := "create"
	switch {
	case s.Present:
		mark = "present"
	case s.Restart:
		mark = "restart"
	}
	return fmt.Sprintf("%-13s %-7s %s", s.Kind, mark, s.What)
}

// Observed is the running lab as read from the kernel and the state dir.
type Observed struct {
	StateDir     bool
	Bin          bool
	Underlay     bool
	Nodes        map[string]bool // node name -> namespace fully wired
	ControlPlane bool
	Controller   bool
	Agents       map[string]bool // node name -> agent process running
}

// Plan lists the steps that make spec from what is observed. It is pure.
// The final StepReady is never Present: `up` always waits for the nodes
// (a no-op wait on a ready lab).
func Plan(s *Spec, o Observed) []Step {
	steps := []Step{
		{Kind: StepStateDir, What: s.StateDir, Present: o.StateDir},
		{Kind: StepBin, What: s.BinDir() + " (flatnet, flatnet-cni as " + strings.Join(cniPluginNames, ", ") + ")", Present: o.Bin},
		{Kind: StepUnderlay, What: fmt.Sprintf("bridge %s, host address %s/%d", s.Bridge, s.HostAddr, s.Underlay.Bits()), Present: o.Underlay},
	}
	for _, n := range s.Nodes {
		steps = append(steps, Step{Kind: StepNode, Node: n.Name,
			What:    fmt.Sprintf("%s: netns %s, eth0 %s/%d <-> %s", n.Name, n.Netns, n.IP, s.Underlay.Bits(), n.HostVeth),
			Present: o.Underlay && o.Nodes[n.Name]})
	}
	steps = append(steps,
		Step{Kind: StepControlPlane, What: fmt.Sprintf("etcd, kube-apiserver on %s", s.HostAddr), Present: o.ControlPlane},
		Step{Kind: StepController, What: "flatnet controller (node IPAM, pod binder)", Present: o.Controller},
	)
	for _, n := range s.Nodes {
		wired := o.Underlay && o.Nodes[n.Name]
		steps = append(steps, Step{Kind: StepAgent, Node: n.Name,
			What:    fmt.Sprintf("flatnet agent on %s (lab runtime, %s)", n.Name, s.Backend),
			Present: o.Agents[n.Name] && wired,
			Restart: o.Agents[n.Name] && !wired})
	}
	steps = append(steps, Step{Kind: StepReady, What: fmt.Sprintf("%d nodes Ready with a pod CIDR and a CNI config", len(s.Nodes))})
	return steps
}

// cniPluginNames are the names flatnet-cni answers to.
var cniPluginNames = []string{"bridge", "host-local", "loopback", "ptp", "macvlan", "bandwidth", "portmap"}
