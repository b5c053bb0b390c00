package proxy

import (
	"context"
	"fmt"
	"time"
)

// Backend programs one IP family's Service rules in one proxy mode: the
// kernel modes (nftables, iptables) and the userspace proxy implement it.
// The proxier (proxy/proxier) owns the informers, the change tracker, the
// sync timing, conntrack cleanup, metrics and health; a Backend only turns
// the model into what its mode installs.
type Backend interface {
	// Mode is the proxy mode's name, as /proxyMode answers it
	// ("nftables", "iptables", "userspace").
	Mode() string
	// Sync makes the installed state match services (every Service of
	// the family the proxier serves; the backend must not keep or modify
	// them beyond the call except by copying what it needs).
	//
	// full: rebuild from a fresh read of what is installed (at start,
	// after a failed sync, at least once per sync period), deleting what
	// nobody wants any more and repairing drift. Otherwise only the
	// services in changed differ from the previous successful Sync (each
	// one's model as in services, nil for one deleted). After an error the proxier's next call is full, so a
	// backend may leave its memory of the previous sync inconsistent on
	// error.
	//
	// A sync is atomic where the mode allows it (one nft transaction, one
	// iptables-restore per table): packets see the old or the new rules.
	Sync(ctx context.Context, services []*Service, changed Changes, full bool) (SyncResult, error)
}

// SyncResult says what one Sync did.
type SyncResult struct {
	// Operations is the size of what was written (nft commands, restore
	// lines, listeners opened and closed), for the logs.
	Operations int
	// Conflicts are services (or parts of them) left out because another
	// service already took their address:port or NodePort; logged.
	Conflicts []error
	// ResyncAfter, when positive, asks for a sync (a partial one will do)
	// after this long even if nothing changes: the backend left something
	// to finish then (the nftables mode's held modulus).
	ResyncAfter time.Duration
}

// ConflictError says a service's address:port or NodePort is already
// taken by another service (the first claim wins), in a kernel mode's
// dispatch (What names the map or the kind of key).
type ConflictError struct {
	Service, Owner string
	What, Key      string
}

func (e *ConflictError) Error() string {
	return fmt.Sprintf("service %s: %s %q is already used by service %s; left out", e.Service, e.What, e.Key, e.Owner)
}
