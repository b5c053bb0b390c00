package agent

import (
	"context"
	"errors"
	"fmt"

	"github.com/flatnet/flatnet/internal/nft"
	"github.com/flatnet/flatnet/internal/nft/nfnl"
	"github.com/flatnet/flatnet/internal/proxy"
	"github.com/flatnet/flatnet/internal/proxy/nftables"
	"sigs.k8s.io/knftables"
)

// overNetlink makes the nftables mode commit its syncs over netlink in
// process (internal/nft/nfnl), keeping nft, when installed, for any
// transaction the netlink compiler does not cover. --proxy-nftables-exec
// keeps nft for everything.
func overNetlink(k modeKit) modeKit {
	k.backend = func(cfg nftables.Config) (proxy.Backend, error) {
		var opts nfnl.Options
		if r, err := nft.New(cfg.Family, cfg.Table); err == nil {
			r.Timeout = proxySyncTimeout
			opts.Fallback = r.Run
		}
		return nftables.NewBackend(nfnl.New(cfg.Family, cfg.Table, opts), cfg), nil
	}
	// The mode needs nf_tables in the kernel, not the nft binary: a
	// listing over netlink (of a table that may well be missing) says so.
	k.probe = func(ctx context.Context) error {
		r := nfnl.New(knftables.IPv4Family, nftables.DefaultTable, nfnl.Options{})
		defer r.Close()
		if _, err := r.ListAll(ctx); err != nil && !nft.IsNotFound(err) {
			return fmt.Errorf("nftables over netlink: %w", err)
		}
		return nil
	}
	k.cleanup = func(ctx context.Context) error {
		var errs []error
		for _, fam := range []knftables.Family{knftables.IPv4Family, knftables.IPv6Family} {
			r := nfnl.New(fam, nftables.DefaultTable, nfnl.Options{})
			if err := nftables.Cleanup(ctx, r); err != nil {
				errs = append(errs, fmt.Errorf("%s %s: %w", fam, nftables.DefaultTable, err))
			}
			r.Close()
		}
		return errors.Join(errs...)
	}
	return k
}
