package nft

// Attachment chains: the shape ipMasq and macspoofchk share. A base chain
// dispatches through a verdict map (key: an address, a port name) to one
// chain per attachment, named by a hash. Install adds an attachment with
// one transaction that only adds (no read, no delete: those wait for an
// RCU grace period); Purge removes attachments and the map elements that
// point to them in one transaction.

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"slices"
	"strings"

	"sigs.k8s.io/knftables"
)

// Hash is the first n hex digits of a SHA-256 over parts, for short,
// stable object names.
func Hash(n int, parts ...string) string {
	h := sha256.New()
	for _, p := range parts {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	return hex.EncodeToString(h.Sum(nil))[:n]
}

// Target returns the chain a verdict-map element goes to (goto or jump),
// or "".
func Target(e *knftables.Element) string {
	if len(e.Value) != 1 || len(e.Key) != 1 {
		return ""
	}
	v := e.Value[0]
	for _, p := range []string{"goto ", "jump "} {
		if strings.HasPrefix(v, p) {
			return strings.TrimPrefix(v, p)
		}
	}
	return ""
}

// Install runs the transaction add fills. When it fails because an object
// is missing (the table: first use), it runs the transaction base fills and
// retries; when it fails because a map element exists with another value
// (a key that a stale attachment still holds), it calls evict and retries.
// Each recovery runs at most once.
func Install(ctx context.Context, n knftables.Interface, add, base func(*knftables.Transaction), evict func() error) error {
	baseDone, evicted := false, false
	for {
		tx := n.NewTransaction()
		add(tx)
		err := n.Run(ctx, tx)
		switch {
		case err == nil:
			return nil
		case IsNotFound(err) && !baseDone:
			tx := n.NewTransaction()
			base(tx)
			if err := n.Run(ctx, tx); err != nil {
				return fmt.Errorf("creating the table: %w", err)
			}
			baseDone = true
		case IsExists(err) && !evicted:
			if err := evict(); err != nil {
				return err
			}
			evicted = true
		default:
			return err
		}
	}
}

// Purge deletes, in one transaction, those of chains that exist (flushed
// first) and every element of elems (the maps' current content) that
// points to one of them. Nothing to delete is success.
func Purge(ctx context.Context, n knftables.Interface, chains map[string]bool, elems []*knftables.Element) error {
	if len(chains) == 0 {
		return nil
	}
	existing, err := n.List(ctx, "chain")
	if err != nil && !IsNotFound(err) {
		return fmt.Errorf("listing chains: %w", err)
	}
	tx := n.NewTransaction()
	for _, e := range elems {
		if chains[Target(e)] {
			tx.Delete(&knftables.Element{Map: e.Map, Key: e.Key})
		}
	}
	for _, c := range existing {
		if chains[c] {
			tx.Flush(&knftables.Chain{Name: c})
			tx.Delete(&knftables.Chain{Name: c})
		}
	}
	if tx.NumOperations() == 0 {
		return nil
	}
	if err := n.Run(ctx, tx); err != nil {
		names := make([]string, 0, len(chains))
		for c := range chains {
			names = append(names, c)
		}
		slices.Sort(names)
		return fmt.Errorf("removing chains %s: %w", strings.Join(names, ", "), err)
	}
	return nil
}
