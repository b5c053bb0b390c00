package main

// Floors: what the building blocks of a plugin cost on this machine,
// measured in the bench host netns after the pods. They bound what any
// plugin set can reach: a DEL that removes a veth and an IFB waits for the
// kernel twice (each unregister waits for an RCU grace period), every
// process started costs a fork+exec, every nft or iptables command a
// process plus a ruleset cache fetch.

import (
	"bytes"
	"fmt"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/vishvananda/netlink"
	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"

	"github.com/flatnet/flatnet/internal/netlinkx"
)

// Floor is one measured building block.
type Floor struct {
	What   string  `json:"what"`
	N      int     `json:"n"`
	Median float64 `json:"median_ms"`
	P90    float64 `json:"p90_ms"`
	Err    string  `json:"error,omitempty"`
}

const floorRuns = 15

func (b *bench) floors() []Floor {
	var out []Floor
	measure := func(what string, setup func() error, op func() error, teardown func()) {
		var ds []time.Duration
		var ferr error
		_ = b.inHost(func() error {
			for i := 0; i < floorRuns; i++ {
				if setup != nil {
					if err := setup(); err != nil {
						ferr = err
						break
					}
				}
				start := time.Now()
				err := op()
				d := time.Since(start)
				if teardown != nil {
					teardown()
				}
				if err != nil {
					ferr = err
					break
				}
				ds = append(ds, d)
			}
			return nil
		})
		s := Summarize(ds)
		f := Floor{What: what, N: s.N, Median: s.Median, P90: s.P90}
		if ferr != nil {
			f.Err = ferr.Error()
		}
		out = append(out, f)
	}
	run := func(stdin string, env []string, argv ...string) func() error {
		return func() error {
			c := exec.Command(argv[0], argv[1:]...)
			c.Stdin = strings.NewReader(stdin)
			if env != nil {
				c.Env = env
			}
			if o, err := c.CombinedOutput(); err != nil {
				return fmt.Errorf("%s: %v: %s", strings.Join(argv, " "), err, bytes.TrimSpace(o))
			}
			return nil
		}
	}

	measure("fork+exec /bin/true", nil, run("", nil, "/bin/true"), nil)
	for _, s := range b.sets {
		measure(s.name+" plugin process start (bridge VERSION)", nil,
			run(`{"cniVersion":"1.0.0"}`, []string{"CNI_COMMAND=VERSION"}, filepath.Join(s.binDir, "bridge")), nil)
	}
	// nftables: a commit that only adds is quick; one that removes
	// anything (rule, chain, element, table) waits for the kernel.
	tbl := b.o.prefix + "t"
	nft := func(script string) func() error { return run(script, nil, "nft", "-f", "-") }
	_ = b.inHost(nft(fmt.Sprintf("add table inet %s\nadd chain inet %s c\n", tbl, tbl)))
	measure("nft list tables (exec + cache fetch)", nil, run("", nil, "nft", "list", "tables"), nil)
	measure("nft -f - adding a rule", nil, nft(fmt.Sprintf("add rule inet %s c tcp dport 80 accept\n", tbl)),
		func() { _ = nft(fmt.Sprintf("flush chain inet %s c\n", tbl))() })
	measure("nft -f - removing a rule (flush chain)", nft(fmt.Sprintf("add rule inet %s c tcp dport 80 accept\n", tbl)),
		nft(fmt.Sprintf("flush chain inet %s c\n", tbl)), nil)
	_ = b.inHost(nft(fmt.Sprintf("delete table inet %s\n", tbl)))
	measure("iptables -t nat -S", nil, run("", nil, "iptables", "-t", "nat", "-S"), nil)

	va, vb, ifb := b.o.prefix+"va", b.o.prefix+"vb", b.o.prefix+"i"
	del := func(names ...string) func() {
		return func() {
			for _, n := range names {
				if l, err := netlinkx.LinkByName(n); err == nil {
					_ = netlink.LinkDel(l)
				}
			}
		}
	}
	addVeth := func() error {
		return netlink.LinkAdd(&netlink.Veth{LinkAttrs: netlink.LinkAttrs{Name: va}, PeerName: vb})
	}
	addIFB := func() error { return netlink.LinkAdd(&netlink.Ifb{LinkAttrs: netlink.LinkAttrs{Name: ifb}}) }
	delByName := func(n string) func() error {
		return func() error {
			l, err := netlinkx.LinkByName(n)
			if err != nil {
				return err
			}
			return netlink.LinkDel(l)
		}
	}
	measure("netlink: create veth pair", nil, addVeth, del(va))
	measure("netlink: delete veth pair", addVeth, delByName(va), del(va))
	measure("netlink: create IFB", nil, addIFB, del(ifb))
	measure("netlink: delete IFB", addIFB, delByName(ifb), del(ifb))
	const group = 0x7e57
	measure("netlink: delete veth+IFB in one RTM_DELLINK (ifgroup)", func() error {
		if err := addVeth(); err != nil {
			return err
		}
		if err := addIFB(); err != nil {
			return err
		}
		for _, n := range []string{va, ifb} {
			l, err := netlinkx.LinkByName(n)
			if err != nil {
				return err
			}
			if err := netlink.LinkSetGroup(l, group); err != nil {
				return err
			}
		}
		return nil
	}, func() error {
		req := nl.NewNetlinkRequest(unix.RTM_DELLINK, unix.NLM_F_ACK)
		req.AddData(nl.NewIfInfomsg(unix.AF_UNSPEC))
		req.AddData(nl.NewRtAttr(unix.IFLA_GROUP, nl.Uint32Attr(group)))
		_, err := req.Execute(unix.NETLINK_ROUTE, 0)
		return err
	}, del(va, ifb))
	measure("netlink: conntrack dump (walks the whole shared hash)", nil, func() error {
		_, err := netlinkx.ConntrackTableList(netlink.ConntrackTable, unix.AF_INET)
		return err
	}, nil)
	return out
}
