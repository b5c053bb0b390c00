package iptables

import (
	"context"
	"errors"
	"fmt"

	"github.com/flatnet/flatnet/internal/ipt"
	"github.com/flatnet/flatnet/internal/proxy"
)

// Backend is the iptables proxy mode for one family: the renderer's
// inputs, restored by ipt, with the state of the last successful sync.
type Backend struct {
	ipt      ipt.Interface
	renderer *Renderer
	// state is what the last successful sync wrote; nil forces a full sync.
	state *State
}

var _ proxy.Backend = (*Backend)(nil)

// NewBackend returns the iptables mode for cfg, programming through i
// (ipt.New() on a node).
func NewBackend(i ipt.Interface, cfg Config) *Backend {
	return &Backend{ipt: i, renderer: New(cfg)}
}

// Mode is "iptables".
func (b *Backend) Mode() string { return "iptables" }

// Renderer returns the backend's renderer (its effective config).
func (b *Backend) Renderer() *Renderer { return b.renderer }

// Sync renders and runs one iptables-restore --noflush holding both
// tables (nothing when nothing changed), full when asked or when the
// state of the previous sync is unknown. iptables-restore -w holds the
// xtables lock for that one run only.
func (b *Backend) Sync(ctx context.Context, services []*proxy.Service, changed proxy.Changes, full bool) (proxy.SyncResult, error) {
	fam := b.renderer.cfg.Family
	var (
		next *State
		in   *Input
	)
	if full || b.state == nil {
		b.state = nil
		existing, err := read(ctx, b.ipt, fam)
		if err != nil {
			return proxy.SyncResult{}, err
		}
		next, in = b.renderer.Full(services, existing)
	} else {
		next, in = b.renderer.partial(b.state, changed)
	}
	res := proxy.SyncResult{Operations: in.Lines()}
	if res.Operations > 0 {
		if err := b.ipt.Restore(ctx, fam, in.Bytes()); err != nil {
			// Partial updated the state in place; it no longer matches
			// the kernel, so the retry is a full sync from a fresh read.
			b.state = nil
			return res, fmt.Errorf("syncing service rules (%s, %d lines): %w", fam, res.Operations, err)
		}
	}
	b.state = next
	res.Conflicts = next.Conflicts
	return res, nil
}

// read saves both tables of fam.
func read(ctx context.Context, i ipt.Interface, fam ipt.Protocol) (*Existing, error) {
	var e Existing
	for _, t := range tables {
		saved, err := i.Save(ctx, fam, t)
		if err != nil {
			return nil, fmt.Errorf("reading the %s %s table: %w", fam, t, err)
		}
		if t == tableNat {
			e.Nat = saved
		} else {
			e.Filter = saved
		}
	}
	return &e, nil
}

// Cleanup removes every chain of the proxy's iptables mode and the jumps
// to them from the nat and filter tables of the families given (both when
// none), in one restore per family; for switching to another mode at
// restart. Other FLATNET- chains (network policy, portmap) and nftables
// tables are left alone; a family whose binaries are missing, or with
// nothing of ours, needs nothing.
func Cleanup(ctx context.Context, i ipt.Interface, families ...ipt.Protocol) error {
	if len(families) == 0 {
		families = []ipt.Protocol{ipt.IPv4, ipt.IPv6}
	}
	var errs []error
	for _, fam := range families {
		existing, err := read(ctx, i, fam)
		if errors.Is(err, ipt.ErrNoIPTables) {
			continue
		}
		if err != nil {
			errs = append(errs, err)
			continue
		}
		in := newInput()
		for _, t := range tables {
			saved := existing.table(t)
			for _, rl := range saved.Rules {
				if !Ours(rl.Chain) && Ours(rl.Target()) {
					in.s(t).deletes = append(in.s(t).deletes, rl)
				}
			}
			for _, c := range saved.Chains {
				if Ours(c) {
					in.s(t).declare = append(in.s(t).declare, c)
					in.s(t).remove = append(in.s(t).remove, c)
				}
			}
		}
		if in.Lines() == 0 {
			continue
		}
		if err := i.Restore(ctx, fam, in.Bytes()); err != nil {
			errs = append(errs, fmt.Errorf("removing the service proxy's %s chains: %w", fam, err))
		}
	}
	return errors.Join(errs...)
}
