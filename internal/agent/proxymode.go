package agent

// Proxy modes. The Service proxy programs the same model (internal/proxy)
// through one of three backends: nftables (the default wherever the kernel
// has nf_tables), iptables (hosts without nf_tables but with xtables), and
// userspace (Go TCP/UDP proxies, for hosts with neither). `auto` picks the
// first that works here and logs why. Whatever mode runs, the rules of the
// other kernel modes are removed at start, so switching modes at a restart
// leaves nothing of the previous one behind (the previous mode's state is
// found in the kernel, not remembered).

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"k8s.io/klog/v2"
	"sigs.k8s.io/knftables"

	"github.com/flatnet/flatnet/internal/ipt"
	"github.com/flatnet/flatnet/internal/nft"
	"github.com/flatnet/flatnet/internal/proxy"
	"github.com/flatnet/flatnet/internal/proxy/iptables"
	"github.com/flatnet/flatnet/internal/proxy/nftables"
	"github.com/flatnet/flatnet/internal/proxy/userspace"
)

// The proxy modes --proxy-mode takes.
const (
	ProxyModeAuto      = "auto"
	ProxyModeNFTables  = "nftables"
	ProxyModeIPTables  = "iptables"
	ProxyModeUserspace = "userspace"
)

// proxySyncTimeout bounds one nft run of the nftables mode (with
// --proxy-nftables-exec, or the netlink runner's fallback) and one
// iptables-save or iptables-restore of the iptables mode: a full sync at
// 10,000 Services takes the kernel 30-120 s, beyond the 30 s default of
// the nft and ipt runners, and a sync killed at the limit fails for good.
const proxySyncTimeout = 5 * time.Minute

// proxyModes lists the modes in auto's order of preference.
var proxyModes = []string{ProxyModeNFTables, ProxyModeIPTables, ProxyModeUserspace}

// modeKit is what each mode needs from the host: a probe saying whether
// the mode can run here (nil error: yes), a constructor for one family's
// backend, and a cleanup removing everything the mode installs (idempotent,
// nil when there is nothing).
type modeKit struct {
	probe   func(ctx context.Context) error
	backend func(cfg nftables.Config) (proxy.Backend, error)
	cleanup func(ctx context.Context) error
}

// proxyModeKits are the modes built into this binary.
func proxyModeKits() map[string]modeKit {
	return map[string]modeKit{
		ProxyModeNFTables: {
			probe: func(ctx context.Context) error {
				r, err := nft.New(knftables.IPv4Family, nftables.DefaultTable)
				if err != nil {
					return err
				}
				return r.Probe(ctx)
			},
			backend: func(cfg nftables.Config) (proxy.Backend, error) {
				r, err := nft.New(cfg.Family, cfg.Table)
				if err != nil {
					return nil, err
				}
				r.Timeout = proxySyncTimeout
				return nftables.NewBackend(r, cfg), nil
			},
			cleanup: cleanupNFTablesMode,
		},
		ProxyModeIPTables: {
			// The binaries, and a kernel that lets them read the nat
			// table (xtables, or nf_tables under iptables-nft).
			probe: func(ctx context.Context) error {
				if err := ipt.Available(ipt.IPv4); err != nil {
					return err
				}
				if _, err := ipt.New().Save(ctx, ipt.IPv4, "nat"); err != nil {
					return fmt.Errorf("reading the nat table: %w", err)
				}
				return nil
			},
			backend: func(cfg nftables.Config) (proxy.Backend, error) {
				fam := ipt.IPv4
				if cfg.Family == knftables.IPv6Family {
					fam = ipt.IPv6
				}
				// A full save or restore at 10,000 Services takes 30-90 s
				// under iptables-nft, beyond ipt's default 30 s limit.
				return iptables.NewBackend(&ipt.Runner{Timeout: proxySyncTimeout}, iptables.Config{
					Family:            fam,
					NodeName:          cfg.NodeName,
					ClusterCIDRs:      cfg.ClusterCIDRs,
					MasqueradeMark:    cfg.MasqueradeMark,
					NodePortAddresses: cfg.NodePortAddresses,
				}), nil
			},
			cleanup: func(ctx context.Context) error {
				return iptables.Cleanup(ctx, &ipt.Runner{Timeout: proxySyncTimeout})
			},
		},
		ProxyModeUserspace: {
			probe: userspace.Probe,
			backend: func(cfg nftables.Config) (proxy.Backend, error) {
				return userspace.New(userspace.Config{
					IPv6:              cfg.Family == knftables.IPv6Family,
					NodeName:          cfg.NodeName,
					ClusterCIDRs:      cfg.ClusterCIDRs,
					NodePortAddresses: cfg.NodePortAddresses,
					Logger:            klog.Background().WithName("proxy-userspace"),
				}), nil
			},
			cleanup: userspace.Cleanup,
		},
	}
}

// cleanupNFTablesMode deletes the nftables mode's tables (both families).
func cleanupNFTablesMode(ctx context.Context) error {
	var errs []error
	for _, fam := range []knftables.Family{knftables.IPv4Family, knftables.IPv6Family} {
		r, err := nft.New(fam, nftables.DefaultTable)
		if errors.Is(err, nft.ErrNoNFT) {
			return nil // without nft there is no table of ours either
		}
		if err != nil {
			return err
		}
		if err := nftables.Cleanup(ctx, r); err != nil {
			errs = append(errs, fmt.Errorf("%s %s: %w", fam, nftables.DefaultTable, err))
		}
	}
	return errors.Join(errs...)
}

// checkProxyMode validates a --proxy-mode value.
func checkProxyMode(mode string) error {
	if mode == ProxyModeAuto {
		return nil
	}
	for _, m := range proxyModes {
		if m == mode {
			return nil
		}
	}
	return fmt.Errorf("%q is not a proxy mode: want auto, %s", mode, strings.Join(proxyModes, ", "))
}

// resolveProxyMode returns the mode to run: an explicit mode when it can
// run here (else an error naming what is missing), or for auto the first
// of proxyModes that can, with the reasons the others were passed over.
func resolveProxyMode(ctx context.Context, mode string, kits map[string]modeKit) (string, []string, error) {
	if err := checkProxyMode(mode); err != nil {
		return "", nil, err
	}
	if mode != ProxyModeAuto {
		kit, ok := kits[mode]
		if !ok {
			return "", nil, fmt.Errorf("proxy mode %s is not built into this flatnet", mode)
		}
		if err := kit.probe(ctx); err != nil {
			return "", nil, fmt.Errorf("proxy mode %s cannot run on this host: %w (choose another --proxy-mode, or auto)", mode, err)
		}
		return mode, nil, nil
	}
	var passed []string
	for _, m := range proxyModes {
		kit, ok := kits[m]
		if !ok {
			continue
		}
		err := kit.probe(ctx)
		if err == nil {
			return m, passed, nil
		}
		passed = append(passed, fmt.Sprintf("%s: %v", m, err))
	}
	return "", passed, fmt.Errorf("no proxy mode can run on this host: %s", strings.Join(passed, "; "))
}

// cleanupOtherModes removes what the modes other than mode installed
// (a previous run in another mode). A failure is returned, not fatal to
// the caller: the new mode's rules come first in their own tables.
func cleanupOtherModes(ctx context.Context, mode string, kits map[string]modeKit) error {
	var errs []error
	for _, m := range proxyModes {
		kit, ok := kits[m]
		if m == mode || !ok || kit.cleanup == nil {
			continue
		}
		if err := kit.cleanup(ctx); err != nil {
			errs = append(errs, fmt.Errorf("removing the %s mode's rules: %w", m, err))
		}
	}
	return errors.Join(errs...)
}

// pickProxyMode resolves mode, logs the choice and clears the other modes'
// leftovers.
func pickProxyMode(ctx context.Context, mode string, kits map[string]modeKit) (string, error) {
	logger := klog.FromContext(ctx)
	got, passed, err := resolveProxyMode(ctx, mode, kits)
	if err != nil {
		return "", err
	}
	if mode == ProxyModeAuto {
		logger.Info("Proxy mode chosen", "mode", got, "passedOver", passed)
	} else {
		logger.Info("Proxy mode", "mode", got)
	}
	if err := cleanupOtherModes(ctx, got, kits); err != nil {
		logger.Error(err, "Rules of another proxy mode left in place; remove them by hand or restart in that mode once")
	}
	return got, nil
}
