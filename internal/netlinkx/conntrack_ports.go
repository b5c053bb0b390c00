package netlinkx

// Deleting conntrack entries by destination port without a full walk.
//
// Every conntrack dump walks the kernel's whole conntrack hash, which all
// network namespaces share: the walk alone (262,144 buckets here, each
// locked in turn) costs about 6 ms, plus about 0.3 µs per entry in the
// hash. What a full dump adds on top is the serializing, copying and
// parsing of each of the namespace's entries: about 10 µs apiece, over a
// second at 100,000 (docs/benchmarks.md).
//
// Linux 5.8 lets the dump filter in the kernel (CTA_FILTER): only the
// entries of one protocol, and destination port, come back. So:
//
//   - no dump when the namespace has no entry (nf_conntrack_count is 0);
//   - one kernel-filtered dump per family that has ports, filtered on the
//     protocol and, when the family has one port (the usual case), that
//     port. Several ports: the protocol only, one walk that brings all the
//     family's entries of the protocol rather than a walk per port;
//   - but one unfiltered dump of both families when both have ports and the
//     namespace holds so few entries that parsing them all costs less than
//     a second walk (smallTable);
//   - each match deleted by its tuple, zone and id, the deletes batched in
//     one sendmsg; no second dump to delete.
//
// A kernel that rejects the filter (EOPNOTSUPP, EINVAL) gets the family's
// whole table dumped instead; one that ignores it (before 5.8, CTA_FILTER
// is an unknown attribute) sends the whole family unasked. Every entry is
// matched again here, so both only cost time.

import (
	"context"
	"errors"
	"fmt"
	"io/fs"
	"slices"
	"strconv"

	"github.com/vishvananda/netlink/nl"
	"golang.org/x/sys/unix"
	"k8s.io/klog/v2"

	"github.com/flatnet/flatnet/internal/sysctl"
)

// smallTable is the entry count up to which one unfiltered dump of every
// family costs no more than two filtered ones: measured here, an
// unfiltered dump of 1,000 entries took ~10 ms and of 2,000 ~20 ms, a
// filtered one ~6-12 ms.
const smallTable = 2000

// ConntrackPorts selects conntrack entries by protocol and
// original-direction destination port.
type ConntrackPorts struct {
	Proto  uint8    // unix.IPPROTO_UDP, ...
	Ports4 []uint16 // IPv4 entries to these ports
	Ports6 []uint16 // IPv6 entries to these ports
}

func (s ConntrackPorts) match(e ctEntry) bool {
	if e.proto != s.Proto {
		return false
	}
	switch e.family {
	case unix.AF_INET:
		return slices.Contains(s.Ports4, e.dport)
	case unix.AF_INET6:
		return slices.Contains(s.Ports6, e.dport)
	}
	return false
}

// ConntrackDeletePorts deletes the conntrack entries that sel selects, in
// the caller's network namespace, and returns how many it deleted. It
// reads no table when the namespace has no entry or conntrack is not
// loaded, and otherwise dumps only what the kernel can filter for it (see
// the top of this file). The errors of single entries (one already gone
// is none) are joined.
func ConntrackDeletePorts(ctx context.Context, sel ConntrackPorts) (uint, error) {
	sel.Ports4, sel.Ports6 = uniq(sel.Ports4), uniq(sel.Ports6)
	if len(sel.Ports4)+len(sel.Ports6) == 0 {
		return 0, nil
	}
	count := -1 // unknown
	v, err := sysctl.Get("net.netfilter.nf_conntrack_count")
	if errors.Is(err, fs.ErrNotExist) || v == "0" {
		return 0, nil // conntrack not loaded, or no entry in this namespace
	}
	if n, err := strconv.Atoi(v); err == nil {
		count = n
	}
	return deletePorts(ctx, sel, planDumps(sel, count))
}

func uniq(ports []uint16) []uint16 {
	return slices.Compact(slices.Sorted(slices.Values(ports)))
}

// ctDump is one conntrack dump.
type ctDump struct {
	family uint8 // unix.AF_INET, unix.AF_INET6, or unix.AF_UNSPEC: every family
	filter bool  // in the kernel, by protocol (and port)
	port   uint16
	// extraFlags are added to the filter's flags: tests set one the
	// kernel rejects, to take the fallback.
	extraFlags uint32
}

func (d ctDump) String() string {
	fam := map[uint8]string{unix.AF_INET: "IPv4", unix.AF_INET6: "IPv6", unix.AF_UNSPEC: "every family's"}[d.family]
	switch {
	case !d.filter:
		return "a dump of " + fam + " conntrack entries"
	case d.port == 0:
		return "a kernel-filtered dump of " + fam + " conntrack entries of the protocol"
	}
	return fmt.Sprintf("a kernel-filtered dump of %s conntrack entries of the protocol to port %d", fam, d.port)
}

// planDumps returns the fewest dumps that bring every entry sel selects
// in a namespace of count entries (-1: unknown).
func planDumps(sel ConntrackPorts, count int) []ctDump {
	if len(sel.Ports4) > 0 && len(sel.Ports6) > 0 && count >= 0 && count <= smallTable {
		return []ctDump{{family: unix.AF_UNSPEC}}
	}
	var out []ctDump
	for _, f := range []struct {
		fam   uint8
		ports []uint16
	}{{unix.AF_INET, sel.Ports4}, {unix.AF_INET6, sel.Ports6}} {
		if len(f.ports) == 0 {
			continue
		}
		d := ctDump{family: f.fam, filter: true}
		if len(f.ports) == 1 {
			d.port = f.ports[0]
		}
		out = append(out, d)
	}
	return out
}

// deletePorts runs dumps, then deletes the entries sel selects.
func deletePorts(ctx context.Context, sel ConntrackPorts, dumps []ctDump) (uint, error) {
	var (
		stale []ctEntry
		errs  []error
	)
	for _, d := range dumps {
		es, err := dumpWithFallback(ctx, d, sel.Proto)
		if err != nil {
			errs = append(errs, err)
		}
		for _, e := range es {
			if sel.match(e) {
				stale = append(stale, e)
			}
		}
	}
	n, err := deleteEntries(stale)
	return n, errors.Join(append(errs, err)...)
}

// dumpWithFallback runs d; when the kernel rejects its filter (no
// CTA_FILTER, or not for these fields) it dumps d's family unfiltered.
func dumpWithFallback(ctx context.Context, d ctDump, proto uint8) ([]ctEntry, error) {
	es, err := dumpEntries(d, proto)
	if err != nil && d.filter && (errors.Is(err, unix.EOPNOTSUPP) || errors.Is(err, unix.EINVAL)) {
		klog.FromContext(ctx).V(4).Info("The kernel rejected a filtered conntrack dump; dumping the family's whole table", "dump", d.String(), "err", err)
		d = ctDump{family: d.family}
		es, err = dumpEntries(d, proto)
	}
	if err != nil {
		return es, fmt.Errorf("%v: %w", d, err)
	}
	return es, nil
}

// dumpEntries runs d, again when the dump was interrupted. An entry that
// does not parse is left out, and reported.
func dumpEntries(d ctDump, proto uint8) ([]ctEntry, error) {
	return retry("dumping conntrack entries", func() ([]ctEntry, error) {
		var (
			es   []ctEntry
			perr error
		)
		err := dumpRequest(d, proto).ExecuteIter(unix.NETLINK_NETFILTER, 0, func(msg []byte) bool {
			e, err := parseEntry(msg)
			if err != nil {
				perr = err
				return true
			}
			es = append(es, e)
			return true
		})
		if err != nil {
			return es, err
		}
		if perr != nil {
			return es, fmt.Errorf("parsing a dumped entry: %w", perr)
		}
		return es, nil
	})
}

// deleteEntries deletes es, batched; one already gone is no error.
func deleteEntries(es []ctEntry) (uint, error) {
	if len(es) == 0 {
		return 0, nil
	}
	reqs := make([]*nl.NetlinkRequest, 0, len(es))
	for _, e := range es {
		r, err := deleteRequest(e)
		if err != nil {
			return 0, err
		}
		reqs = append(reqs, r)
	}
	res, err := execBatch(unix.NETLINK_NETFILTER, reqs)
	if err != nil {
		return 0, fmt.Errorf("deleting %d conntrack entries: %w", len(reqs), err)
	}
	var (
		n    uint
		errs []error
	)
	for i, err := range res {
		switch {
		case err == nil:
			n++
		case !errors.Is(err, unix.ENOENT):
			errs = append(errs, fmt.Errorf("deleting conntrack entry %v: %w", es[i], err))
		}
	}
	return n, errors.Join(errs...)
}
