package agent

import (
	"github.com/flatnet/flatnet/internal/nft"
	"github.com/flatnet/flatnet/internal/nft/nfnl"
	"github.com/flatnet/flatnet/internal/proxy"
	"github.com/flatnet/flatnet/internal/proxy/nftables"
)

// overNetlink makes the nftables mode commit its syncs over netlink in
// process (internal/nft/nfnl), keeping nft, when installed, for any
// transaction the netlink compiler does not cover. --proxy-nftables-exec
// keeps nft for everything.
func overNetlink(k modeKit) modeKit {
	k.backend = func(cfg nftables.Config) (proxy.Backend, error) {
		var opts nfnl.Options
		if r, err := nft.New(cfg.Family, cfg.Table); err == nil {
			opts.Fallback = r.Run
		}
		return nftables.NewBackend(nfnl.New(cfg.Family, cfg.Table, opts), cfg), nil
	}
	return k
}
