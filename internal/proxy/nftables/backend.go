package nftables

import (
	"context"
	"fmt"

	"sigs.k8s.io/knftables"

	"github.com/flatnet/flatnet/internal/nft"
	"github.com/flatnet/flatnet/internal/proxy"
)

// NFT is what the nftables backend needs from nftables: nft.Runner and
// nft.Fake (bound to the renderer's family and table) implement it.
type NFT interface {
	NewTransaction() *knftables.Transaction
	Run(ctx context.Context, tx *knftables.Transaction) error
	// ListAll names the table's objects by type ("chain", "set", ...) in
	// one read; a missing table is nil or a not-found error.
	ListAll(ctx context.Context) (map[string][]string, error)
}

// Backend is the nftables proxy mode: the renderer's transactions, run by
// NFT, with the state of the last successful sync.
type Backend struct {
	nft      NFT
	renderer *Renderer
	// state is what the last successful sync wrote; nil forces a full sync.
	state *State
}

var _ proxy.Backend = (*Backend)(nil)

// NewBackend returns the nftables mode for cfg, programming through n.
func NewBackend(n NFT, cfg Config) *Backend {
	return &Backend{nft: n, renderer: New(cfg)}
}

// Mode is "nftables".
func (b *Backend) Mode() string { return "nftables" }

// Renderer returns the backend's renderer (its effective config).
func (b *Backend) Renderer() *Renderer { return b.renderer }

// Sync renders and runs one transaction, full when asked or when the state
// of the previous sync is unknown.
func (b *Backend) Sync(ctx context.Context, services []*proxy.Service, changed proxy.Changes, full bool) (proxy.SyncResult, error) {
	tx := b.nft.NewTransaction()
	var next *State
	if full || b.state == nil {
		existing, err := b.existing(ctx)
		if err != nil {
			b.state = nil
			return proxy.SyncResult{}, err
		}
		next = b.renderer.Full(tx, services, b.state, existing)
	} else {
		changed = b.state.WithHoldsDue(services, changed, b.renderer.cfg.ModulusHold, b.renderer.cfg.now())
		next = b.renderer.partial(tx, b.state, changed)
	}
	res := proxy.SyncResult{Operations: tx.NumOperations()}
	if err := b.nft.Run(ctx, tx); err != nil {
		// Partial updated the state in place; it no longer matches the
		// kernel, so the retry is a full sync from a fresh listing.
		b.state = nil
		return res, fmt.Errorf("syncing service rules (%d operations): %w", tx.NumOperations(), err)
	}
	b.state = next
	res.Conflicts = next.Conflicts
	res.ResyncAfter = next.NextHoldDue(b.renderer.cfg.ModulusHold, b.renderer.cfg.now())
	return res, nil
}

// existing lists the table's chains, sets and maps; nil when the table is absent.
func (b *Backend) existing(ctx context.Context) (*Existing, error) {
	all, err := b.nft.ListAll(ctx)
	if nft.IsNotFound(err) || (err == nil && all == nil) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("listing table: %w", err)
	}
	return &Existing{Chains: all["chain"], Sets: all["set"], Maps: all["map"]}, nil
}

// Cleanup deletes the mode's table, if there is one: used when the agent
// starts in another proxy mode.
func Cleanup(ctx context.Context, n interface {
	NewTransaction() *knftables.Transaction
	Run(ctx context.Context, tx *knftables.Transaction) error
}) error {
	tx := n.NewTransaction()
	tx.Delete(&knftables.Table{})
	if err := n.Run(ctx, tx); err != nil && !nft.IsNotFound(err) {
		return err
	}
	return nil
}
