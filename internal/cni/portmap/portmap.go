// Package portmap is the portmap CNI plugin: it forwards host ports to a
// container (the portMappings capability) with nftables (programmed over
// netlink in process, internal/nft/nfnl), or with iptables when asked to
// or when nf_tables does not answer. It reads the reference
// plugin's configuration (plugins/meta/portmap): snat, markMasqBit,
// externalSetMarkChain, masqAll, conditionsV4/V6, backend.
//
// Every verb works the same way: parse (config.go), compute a Plan of what
// the attachment needs (plan.go), render it for the backend
// (nftables.go, iptables.go) and apply it in one narrow step. The backends
// and the host facilities sit behind the env struct so that unit tests run
// the verbs against knftables' fake and our iptables fake.
package portmap

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	"sigs.k8s.io/knftables"

	"github.com/flatnet/flatnet/internal/cni/cnierr"
	"github.com/flatnet/flatnet/internal/cni/ipmasq"
	"github.com/flatnet/flatnet/internal/cni/plugin"
	"github.com/flatnet/flatnet/internal/ipt"
	"github.com/flatnet/flatnet/internal/nft"
)

// Plugin is portmap as a CNI plugin.
var Plugin = plugin.Plugin{Name: "portmap", Funcs: realEnv().funcs()}

// Stage is portmap's verbs in process, for the flatnet plugin type.
var Stage = realEnv().stage()

// backend is one way of programming the rules.
type backend interface {
	name() string
	add(ctx context.Context, p *Plan) error
	del(ctx context.Context, id ID, prune bool) error
	check(ctx context.Context, p *Plan) error
	gc(ctx context.Context, network string, valid map[ID]bool) error
}

// env is everything the verbs touch outside the process.
type env struct {
	// newNFT returns the nftables table, or an error (code 105) when
	// nf_tables does not answer.
	newNFT func() (nft.Interface, error)
	// probeNFT checks that nftables works (STATUS): no process.
	probeNFT func(ctx context.Context) error
	ipt      ipt.Interface
	// iptAvailable says whether the binaries for a family are installed.
	iptAvailable func(ipt.Protocol) error
	// routeLocalnet enables route_localnet toward a container address.
	routeLocalnet func(netip.Addr) error
	// flushUDP deletes UDP conntrack entries to host ports (IPv4, IPv6).
	flushUDP func(ports4, ports6 []uint16) error
	lock     func() (func(), error)
	stdout   io.Writer
	stderr   io.Writer
}

func realEnv() *env {
	return &env{
		newNFT: func() (nft.Interface, error) {
			r, err := ipmasq.NewNFT(knftables.InetFamily, nftTable)
			if err != nil {
				return nil, err
			}
			return r, nil
		},
		// One GETGEN over netlink (NewNFT's probe), where nft.Runner's
		// Probe ran `nft --version` and `nft --check`.
		probeNFT: func(ctx context.Context) error {
			r, err := ipmasq.NewNFT(knftables.InetFamily, nftTable)
			if err != nil {
				return err
			}
			return r.Close()
		},
		ipt:           ipt.New(),
		iptAvailable:  ipt.Available,
		routeLocalnet: enableRouteLocalnet,
		flushUDP:      flushUDPConntrack,
		lock:          func() (func(), error) { return lockFile(lockPath) },
		stdout:        os.Stdout,
		stderr:        os.Stderr,
	}
}

func (e *env) stage() plugin.Stage {
	return plugin.Stage{Name: "portmap", Add: e.add, Del: e.cmdDel, Check: e.cmdCheck, GC: e.cmdGC, Status: e.cmdStatus, PassThrough: true}
}

func (e *env) funcs() skel.CNIFuncs {
	return skel.CNIFuncs{Add: e.cmdAdd, Del: e.cmdDel, Check: e.cmdCheck, GC: e.cmdGC, Status: e.cmdStatus}
}

const opTimeout = 2 * time.Minute

func (e *env) logf(format string, args ...any) {
	fmt.Fprintf(e.stderr, "portmap: "+format+"\n", args...)
}

// iptBackend returns the iptables backend with the families whose
// binaries are installed, or an error when IPv4's are not.
func (e *env) iptBackend() (*iptBackend, error) {
	if err := e.iptAvailable(ipt.IPv4); err != nil {
		return nil, err
	}
	b := &iptBackend{ipt: e.ipt, protos: []ipt.Protocol{ipt.IPv4}}
	if e.iptAvailable(ipt.IPv6) == nil {
		b.protos = append(b.protos, ipt.IPv6)
	}
	return b, nil
}

// backend picks the backend for cfg: the one asked for, else nftables,
// else (nf_tables does not answer) iptables. Missing tools have code 105.
func (e *env) backend(cfg *Config, verbose bool) (backend, error) {
	missing := func(err error, what string) error {
		return cnierr.Wrap(cnierr.KernelFeatureMissing, err, "portmap: the %s backend is not available", what)
	}
	switch cfg.Backend {
	case backendIPT:
		b, err := e.iptBackend()
		if err != nil {
			return nil, missing(err, backendIPT)
		}
		return b, nil
	case backendNFT:
		n, err := e.newNFT()
		if err != nil {
			return nil, missing(err, backendNFT)
		}
		return &nftBackend{nft: n}, nil
	}
	n, nerr := e.newNFT()
	if nerr == nil {
		return &nftBackend{nft: n}, nil
	}
	b, ierr := e.iptBackend()
	if ierr != nil {
		return nil, cnierr.Wrap(cnierr.KernelFeatureMissing, errors.Join(nerr, ierr), "portmap: neither nftables nor iptables is available")
	}
	if verbose {
		e.logf("nftables is not available (%v); falling back to the iptables backend (set \"backend\" to choose)", nerr)
	}
	return b, nil
}

// applyErr classifies a failure to program rules.
func applyErr(err error, verb string, b backend) error {
	if _, ok := cnierr.Code(err); ok {
		return err
	}
	code := cnierr.Internal
	if errors.Is(err, nft.ErrNoNFT) || errors.Is(err, ipt.ErrNoIPTables) || strings.Contains(err.Error(), "not supported") {
		code = cnierr.KernelFeatureMissing
	}
	return cnierr.Wrap(code, err, "portmap %s (%s backend)", verb, b.name())
}

// cmdAdd is ADD as the standalone plugin: add, then print the result.
func (e *env) cmdAdd(args *skel.CmdArgs) error {
	r, err := e.add(args)
	if err != nil {
		return err
	}
	if err := r.PrintTo(e.stdout); err != nil {
		return cnierr.Wrap(cnierr.IOFailure, err, "portmap: printing the result")
	}
	return nil
}

// add maps the ports and returns the prevResult in the config's CNI
// version.
func (e *env) add(args *skel.CmdArgs) (types.Result, error) {
	cfg, err := parseConfig(args.StdinData, true)
	if err != nil {
		return nil, err
	}
	if cfg.Prev == nil {
		return nil, cnierr.New(cnierr.InvalidConfig, "portmap: no prevResult: portmap is a chained plugin and must follow a plugin that creates the interface (bridge, ptp...)")
	}
	if len(cfg.Mappings) == 0 {
		return asVersion(cfg.Prev, cfg.CNIVersion)
	}
	v4, v6 := containerIPs(cfg.Prev, args.IfName)
	att := Attachment{Network: cfg.Name, ContainerID: args.ContainerID, IfName: args.IfName}
	p := buildPlan(cfg, att, v4, v6)
	if len(p.Families) == 0 {
		e.logf("no address of %s in prevResult matches a mapping's family; no ports mapped for %s", args.IfName, args.ContainerID)
		return asVersion(cfg.Prev, cfg.CNIVersion)
	}
	b, err := e.backend(cfg, true)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	unlock, err := e.lock()
	if err != nil {
		return nil, err
	}
	defer unlock()

	if err := b.add(ctx, p); err != nil {
		// One family may have been written before another failed.
		if derr := b.del(ctx, p.ID, true); derr != nil {
			err = errors.Join(err, fmt.Errorf("undoing: %w", derr))
		}
		return nil, applyErr(err, "ADD", b)
	}
	if p.SNAT && v4.IsValid() && p.HasIPv4() {
		if err := e.routeLocalnet(v4.Addr()); err != nil {
			if derr := b.del(ctx, p.ID, true); derr != nil {
				err = errors.Join(err, fmt.Errorf("undoing: %w", derr))
			}
			return nil, cnierr.Wrap(cnierr.Internal, err, "portmap ADD")
		}
	}
	// Stale UDP flows would keep bypassing the new DNAT. Informative only.
	if err := e.flushUDP(p.UDPPorts(false), p.UDPPorts(true)); err != nil {
		e.logf("%v", err)
	}
	return asVersion(cfg.Prev, cfg.CNIVersion)
}

// asVersion is r in CNI version v.
func asVersion(r types.Result, v string) (types.Result, error) {
	out, err := r.GetAsVersion(v)
	if err != nil {
		return nil, cnierr.Wrap(cnierr.IncompatibleVersion, err, "portmap: converting prevResult to CNI %s", v)
	}
	return out, nil
}

func (e *env) cmdDel(args *skel.CmdArgs) error {
	// prevResult only narrows the conntrack flush below: DEL must not
	// fail on a broken one, so that parse is retried without it.
	cfg, err := parseConfig(args.StdinData, true)
	if err != nil {
		cfg, err = parseConfig(args.StdinData, false)
	}
	if err != nil {
		if code, _ := cnierr.Code(err); code == cnierr.InvalidConfig {
			// ADD failed on this configuration, so it made no rules.
			return nil
		}
		return err
	}
	if len(cfg.Mappings) == 0 {
		return nil // as the reference: no mappings, nothing was added
	}
	b, err := e.backend(cfg, false)
	if err != nil {
		if code, _ := cnierr.Code(err); code == cnierr.KernelFeatureMissing {
			return nil // no backend, so ADD made no rules
		}
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	unlock, err := e.lock()
	if err != nil {
		return err
	}
	defer unlock()
	id := attachmentID(cfg.Name, args.ContainerID, args.IfName)
	if err := b.del(ctx, id, false); err != nil {
		return applyErr(err, "DEL", b)
	}
	// A later user of the port (another pod, a host process) must not
	// inherit our NAT state: the UDP flows to the ports mapped in the
	// families the pod had an address of (prevResult's; without one, in
	// every family a mapping allows). A family skipped is a walk of the
	// kernel's whole conntrack hash saved. Informative only.
	v4, v6 := containerIPs(cfg.Prev, args.IfName)
	if !v4.IsValid() && !v6.IsValid() {
		v4, v6 = netip.PrefixFrom(netip.IPv4Unspecified(), 32), netip.PrefixFrom(netip.IPv6Unspecified(), 128)
	}
	p := buildPlan(cfg, Attachment{}, v4, v6)
	if err := e.flushUDP(p.UDPPorts(false), p.UDPPorts(true)); err != nil {
		e.logf("%v", err)
	}
	return nil
}

func (e *env) cmdCheck(args *skel.CmdArgs) error {
	cfg, err := parseConfig(args.StdinData, true)
	if err != nil {
		return err
	}
	if cfg.Prev == nil {
		return cnierr.New(cnierr.InvalidConfig, "portmap CHECK: no prevResult: CHECK needs the result of ADD")
	}
	if len(cfg.Mappings) == 0 {
		return nil
	}
	v4, v6 := containerIPs(cfg.Prev, args.IfName)
	p := buildPlan(cfg, Attachment{Network: cfg.Name, ContainerID: args.ContainerID, IfName: args.IfName}, v4, v6)
	if len(p.Families) == 0 {
		return nil
	}
	b, err := e.backend(cfg, false)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	if err := b.check(ctx, p); err != nil {
		if _, ok := cnierr.Code(err); ok {
			return err
		}
		return cnierr.Wrap(cnierr.CheckFailed, err, "portmap CHECK of %s/%s (%s backend)", args.ContainerID, args.IfName, b.name())
	}
	return nil
}

// cmdGC removes the rules of every attachment of this network that is not
// in the valid list, from both backends (a node may have switched).
func (e *env) cmdGC(args *skel.CmdArgs) error {
	cfg, err := parseConfig(args.StdinData, false)
	if err != nil {
		return err
	}
	attachments, err := plugin.ValidAttachments(args.StdinData)
	if err != nil {
		return err
	}
	valid := map[ID]bool{}
	for a := range attachments {
		valid[attachmentID(cfg.Name, a.ContainerID, a.IfName)] = true
	}
	var backends []backend
	if n, err := e.newNFT(); err == nil {
		backends = append(backends, &nftBackend{nft: n})
	}
	if b, err := e.iptBackend(); err == nil {
		backends = append(backends, b)
	}
	if len(backends) == 0 {
		return nil // no tool, so no rules of ours
	}
	ctx, cancel := context.WithTimeout(context.Background(), opTimeout)
	defer cancel()
	unlock, err := e.lock()
	if err != nil {
		return err
	}
	defer unlock()
	var errs []error
	for _, b := range backends {
		if err := b.gc(ctx, cfg.Name, valid); err != nil {
			errs = append(errs, applyErr(err, "GC", b))
		}
	}
	return errors.Join(errs...)
}

// cmdStatus says whether ADD can program rules now: code 50 otherwise.
func (e *env) cmdStatus(args *skel.CmdArgs) error {
	cfg, err := parseConfig(args.StdinData, false)
	if err != nil {
		return err
	}
	unavailable := func(err error) error {
		return cnierr.Wrap(cnierr.PluginNotAvailable, err, "portmap is not available")
	}
	b, err := e.backend(cfg, false)
	if err != nil {
		return unavailable(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	switch b := b.(type) {
	case *nftBackend:
		if err := e.probeNFT(ctx); err != nil {
			return unavailable(fmt.Errorf("nftables: %w", err))
		}
	case *iptBackend:
		for _, proto := range b.protos {
			if _, err := b.ipt.Save(ctx, proto, iptNAT); err != nil {
				return unavailable(fmt.Errorf("%s: %w", proto, err))
			}
		}
	}
	return nil
}
