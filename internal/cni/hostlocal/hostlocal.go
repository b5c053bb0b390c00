// Package hostlocal is the host-local IPAM plugin: it reads the reference
// plugin's JSON and keeps the reference's on-disk layout and locking (see
// allocator's design note), so it can run exec'd, in-process under
// bridge/ptp/macvlan (through internal/cni/ipam), or next to the reference
// plugin on the same dataDir.
package hostlocal

import (
	"encoding/json"
	"errors"
	"fmt"
	"net/netip"
	"os"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/flatnet/flatnet/internal/cni/cnierr"
	"github.com/flatnet/flatnet/internal/cni/hostlocal/allocator"
	"github.com/flatnet/flatnet/internal/cni/hostlocal/store"
	"github.com/flatnet/flatnet/internal/cni/plugin"
)

// Name is the plugin name.
const Name = "host-local"

// Plugin is host-local as a CNI plugin.
var Plugin = plugin.Plugin{
	Name: Name,
	Funcs: skel.CNIFuncs{
		Add: func(args *skel.CmdArgs) error {
			res, c, err := add(args)
			if err != nil {
				return err
			}
			return plugin.PrintResult(res, c.CNIVersion)
		},
		Del:    Del,
		Check:  Check,
		GC:     GC,
		Status: Status,
	},
}

// openLocked opens the network's store and takes its lock; the returned
// func unlocks and closes it.
func openLocked(c *allocator.Config) (*store.Disk, func(), error) {
	st, err := store.Open(c.Name, c.DataDir)
	if err != nil {
		return nil, nil, cnierr.Wrap(cnierr.IOFailure, err, "host-local: network %q, dataDir %q", c.Name, c.DataDir)
	}
	if err := st.Lock(); err != nil {
		st.Close()
		return nil, nil, cnierr.Wrap(cnierr.IOFailure, err, "host-local: network %q", c.Name)
	}
	return st, func() { st.Unlock(); st.Close() }, nil
}

// Add reserves one address per range set for (ContainerID, IfName) and
// returns them with the config's routes (and DNS from resolvConf).
func Add(args *skel.CmdArgs) (*current.Result, error) {
	res, _, err := add(args)
	return res, err
}

func add(args *skel.CmdArgs) (*current.Result, *allocator.Config, error) {
	c, err := allocator.Load(args.StdinData, args.Args)
	if err != nil {
		return nil, nil, err
	}
	var dns *types.DNS
	if c.ResolvConf != "" {
		if dns, err = parseResolvConf(c.ResolvConf); err != nil {
			return nil, nil, cnierr.Wrap(cnierr.InvalidConfig, err, "host-local: ipam.resolvConf")
		}
	}
	st, done, err := openLocked(c)
	if err != nil {
		return nil, nil, err
	}
	defer done()
	res, err := allocator.Allocate(c, st, args.ContainerID, args.IfName)
	if code, _ := cnierr.Code(err); code == cnierr.RangeExhausted {
		// STATUS stays ready on a full range (see Status): this error is
		// where an operator learns of it, so it says what to do.
		return nil, nil, fmt.Errorf("%w; the reservations are the files in %s: free those of pods that are gone "+
			"(CNI DEL, or a CNI GC from the runtime) or give the network a larger range", err, st.Path())
	}
	if err != nil {
		return nil, nil, err
	}
	if dns != nil {
		res.DNS = *dns
	}
	return res, c, nil
}

// Del frees every address (ContainerID, IfName) holds. Nothing reserved
// is success.
func Del(args *skel.CmdArgs) error {
	c, err := allocator.Load(args.StdinData, args.Args)
	if err != nil {
		return err
	}
	st, done, err := openLocked(c)
	if err != nil {
		return err
	}
	defer done()
	if err := st.ReleaseByID(args.ContainerID, args.IfName); err != nil {
		return cnierr.Wrap(cnierr.IOFailure, err, "host-local: network %q: releasing container %q interface %q", c.Name, args.ContainerID, args.IfName)
	}
	return nil
}

// Check verifies that (ContainerID, IfName) holds a reservation and, when
// the config carries a prevResult, that the addresses of prevResult inside
// our range sets are exactly the ones reserved for it (code 106
// otherwise).
func Check(args *skel.CmdArgs) error {
	c, err := allocator.Load(args.StdinData, args.Args)
	if err != nil {
		return err
	}
	var nc types.NetConf
	if err := json.Unmarshal(args.StdinData, &nc); err != nil {
		return cnierr.Wrap(cnierr.DecodingFailure, err, "host-local: decoding network config")
	}
	prev, err := plugin.LoadPrevResult(&nc)
	if err != nil {
		return err
	}
	st, done, err := openLocked(c)
	if err != nil {
		return err
	}
	defer done()
	held, err := st.GetByID(args.ContainerID, args.IfName)
	if err != nil {
		return cnierr.Wrap(cnierr.IOFailure, err, "host-local: network %q: reading reservations", c.Name)
	}
	if len(held) == 0 {
		return cnierr.New(cnierr.CheckFailed, "host-local: no address reserved for container %q interface %q in %s",
			args.ContainerID, args.IfName, st.Path())
	}
	if prev == nil {
		return nil
	}
	inRanges := func(ip netip.Addr) bool {
		for _, s := range c.Ranges {
			if s.Contains(ip) {
				return true
			}
		}
		return false
	}
	mine := map[netip.Addr]bool{}
	for _, ip := range held {
		if inRanges(ip) {
			mine[ip] = true
		}
	}
	seen := map[netip.Addr]bool{}
	for _, ipc := range prev.IPs {
		ip, ok := netip.AddrFromSlice(ipc.Address.IP)
		if !ok {
			continue
		}
		ip = ip.Unmap()
		if !inRanges(ip) {
			continue
		}
		seen[ip] = true
		if !mine[ip] {
			return cnierr.New(cnierr.CheckFailed, "host-local: prevResult address %s is not reserved for container %q interface %q in %s",
				ip, args.ContainerID, args.IfName, st.Path())
		}
	}
	for ip := range mine {
		if !seen[ip] {
			return cnierr.New(cnierr.CheckFailed, "host-local: %s is reserved for container %q interface %q but missing from prevResult",
				ip, args.ContainerID, args.IfName)
		}
	}
	return nil
}

// GC frees every reservation of the network whose (container ID, ifname)
// is not in cni.dev/valid-attachments (or cni.dev/attachments).
func GC(args *skel.CmdArgs) error {
	c, err := allocator.Load(args.StdinData, args.Args)
	if err != nil {
		return err
	}
	validSet, err := plugin.ValidAttachments(args.StdinData)
	if err != nil {
		return err
	}
	valid := make([]allocator.Attachment, 0, len(validSet))
	for a := range validSet {
		valid = append(valid, allocator.Attachment{ContainerID: a.ContainerID, IfName: a.IfName})
	}
	st, done, err := openLocked(c)
	if err != nil {
		return err
	}
	defer done()
	all, err := st.List()
	if err != nil {
		return cnierr.Wrap(cnierr.IOFailure, err, "host-local: network %q GC", c.Name)
	}
	var errs []error
	for _, ip := range allocator.Stale(all, valid) {
		errs = append(errs, st.Release(ip))
	}
	if err := errors.Join(errs...); err != nil {
		return cnierr.Wrap(cnierr.IOFailure, err, "host-local: network %q GC", c.Name)
	}
	return nil
}

// Status reports code 50 only when host-local cannot work at all: the
// dataDir cannot be opened, written, locked or read. A full range set is
// not such a case: under containerd, a STATUS error becomes
// NetworkReady=false, the kubelet marks the node NotReady, and the node is
// tainted and its running pods evicted, for want of addresses that only
// new pods need. Exhaustion is reported where it happens: the ADD fails
// with code 101, naming the range set and what to do.
func Status(args *skel.CmdArgs) error {
	c, err := allocator.Load(args.StdinData, args.Args)
	if err != nil {
		return err
	}
	st, err := store.Open(c.Name, c.DataDir)
	if err != nil {
		return cnierr.Wrap(cnierr.PluginNotAvailable, err, "host-local: network %q: dataDir not usable", c.Name)
	}
	defer st.Close()
	if err := writable(st.Path()); err != nil {
		return cnierr.Wrap(cnierr.PluginNotAvailable, err, "host-local: network %q: dataDir %s is not writable", c.Name, st.Path())
	}
	if err := st.Lock(); err != nil {
		return cnierr.Wrap(cnierr.PluginNotAvailable, err, "host-local: network %q", c.Name)
	}
	defer st.Unlock()
	if _, err := st.List(); err != nil {
		return cnierr.Wrap(cnierr.PluginNotAvailable, err, "host-local: network %q: reading reservations", c.Name)
	}
	return nil
}

// writable proves dir accepts new files by creating and removing one (a
// name no host-local reads as a reservation; unique, so concurrent STATUS
// calls do not trip over each other). access(2) would not catch a full
// disk and ignores mode bits for root.
func writable(dir string) error {
	f, err := os.CreateTemp(dir, ".status-")
	if err != nil {
		return err
	}
	f.Close()
	if err := os.Remove(f.Name()); err != nil {
		return fmt.Errorf("removing probe file: %w", err)
	}
	return nil
}
