package lab

import (
	"errors"
	"fmt"
	"maps"
	"net/netip"
	"slices"
)

// fakeKernel is a kernelIO over a view, changed by fixes as the kernel
// would be: a veth pair and the routes on a link go with it, a new
// namespace has lo down and its sysctls at their defaults. It refuses a
// fix whose namespace, bridge or link does not exist yet, so a fix list
// in the wrong order fails.
type fakeKernel struct {
	v     view
	peers map[nsLink]nsLink // veth ends, both ways
}

type nsLink struct{ ns, link string }

// newFakeKernel is a machine with an empty host namespace.
func newFakeKernel() *fakeKernel {
	return &fakeKernel{v: view{"": newNSView()}, peers: map[nsLink]nsLink{}}
}

func newNSView() *nsView {
	return &nsView{links: map[string]linkView{"lo": {kind: "device"}}, sysctls: map[string]string{}}
}

// read implements kernelIO: a copy of the whole view (diff looks only at
// what it asks for).
func (f *fakeKernel) read(map[string]*query) (view, error) {
	out := view{}
	for path, n := range f.v {
		if n == nil {
			out[path] = nil
			continue
		}
		c := &nsView{links: map[string]linkView{}, routes: slices.Clone(n.routes), sysctls: maps.Clone(n.sysctls)}
		for name, l := range n.links {
			l.addrs = slices.Clone(l.addrs)
			c.links[name] = l
		}
		out[path] = c
	}
	return out, nil
}

func (f *fakeKernel) ns(path string) (*nsView, error) {
	if n := f.v[path]; n != nil {
		return n, nil
	}
	return nil, fmt.Errorf("%s does not exist", nsName(path))
}

func (f *fakeKernel) deleteLink(path, name string) {
	n := f.v[path]
	if n == nil {
		return
	}
	delete(n.links, name)
	n.routes = slices.DeleteFunc(n.routes, func(r route) bool { return r.dev == name })
	if p, ok := f.peers[nsLink{path, name}]; ok {
		delete(f.peers, nsLink{path, name})
		delete(f.peers, p)
		f.deleteLink(p.ns, p.link)
	}
}

// apply implements kernelIO.
func (f *fakeKernel) apply(x fix) error {
	switch x.op {
	case fixCreateNetns:
		if f.v[x.ns] != nil {
			return fmt.Errorf("%s exists", x.ns)
		}
		f.v[x.ns] = newNSView()
		return nil
	case fixDeleteNetns:
		if n := f.v[x.ns]; n != nil {
			for name := range n.links {
				f.deleteLink(x.ns, name)
			}
		}
		delete(f.v, x.ns)
		return nil
	case fixRefuse:
		return errors.New(x.why)
	}
	n, err := f.ns(x.ns)
	if err != nil {
		if x.op == fixDeleteLink {
			return nil
		}
		return err
	}
	link := func(name string) (linkView, error) {
		l, ok := n.links[name]
		if !ok {
			return l, fmt.Errorf("no link %s in %s", name, nsName(x.ns))
		}
		return l, nil
	}
	switch x.op {
	case fixCreateBridge:
		if _, ok := n.links[x.link]; ok {
			return fmt.Errorf("%s exists", x.link)
		}
		n.links[x.link] = linkView{kind: "bridge"}
	case fixCreateVeth:
		if br, err := link(x.master); err != nil || br.kind != "bridge" {
			return fmt.Errorf("no bridge %s: %v", x.master, err)
		}
		peer, err := f.ns(x.peerNS)
		if err != nil {
			return err
		}
		if _, ok := n.links[x.link]; ok {
			return fmt.Errorf("%s exists", x.link)
		}
		if _, ok := peer.links["eth0"]; ok {
			return fmt.Errorf("eth0 exists in %s", nsName(x.peerNS))
		}
		n.links[x.link] = linkView{kind: "veth", up: true, master: x.master}
		peer.links["eth0"] = linkView{kind: "veth"}
		host, inside := nsLink{x.ns, x.link}, nsLink{x.peerNS, "eth0"}
		f.peers[host], f.peers[inside] = inside, host
	case fixDeleteLink:
		f.deleteLink(x.ns, x.link)
	case fixSetMaster, fixSetUp, fixAddAddr:
		l, err := link(x.link)
		if err != nil {
			return err
		}
		switch x.op {
		case fixSetMaster:
			if _, err := link(x.master); err != nil {
				return err
			}
			l.master = x.master
		case fixSetUp:
			l.up = true
		case fixAddAddr:
			if slices.Contains(l.addrs, x.addr) {
				return fmt.Errorf("%s already has %s", x.link, x.addr)
			}
			l.addrs = append(l.addrs, x.addr)
		}
		n.links[x.link] = l
	case fixReplaceRoute:
		if _, err := link(x.route.dev); err != nil {
			return err
		}
		n.routes = slices.DeleteFunc(n.routes, func(r route) bool { return r.dst == x.route.dst })
		n.routes = append(n.routes, x.route)
	case fixSetSysctl:
		n.sysctls[x.key] = x.value
	default:
		return fmt.Errorf("unknown fix %d", x.op)
	}
	return nil
}

// dropRoute removes the routes to dst in path (a drift).
func (f *fakeKernel) dropRoute(path string, dst netip.Prefix) {
	n := f.v[path]
	n.routes = slices.DeleteFunc(n.routes, func(r route) bool { return r.dst == dst })
}
