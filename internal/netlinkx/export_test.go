package netlinkx

import "context"

// Dump is a ctDump that the external tests can write.
type Dump struct {
	Family     uint8
	Filter     bool
	Port       uint16
	ExtraFlags uint32
}

// DeletePortsWith is ConntrackDeletePorts with the dumps given, not
// planned (and nf_conntrack_count not read).
func DeletePortsWith(ctx context.Context, sel ConntrackPorts, dumps []Dump) (uint, error) {
	ds := make([]ctDump, len(dumps))
	for i, d := range dumps {
		ds[i] = ctDump{family: d.Family, filter: d.Filter, port: d.Port, extraFlags: d.ExtraFlags}
	}
	return deletePorts(ctx, sel, ds)
}

// DumpOnly runs one dump with no fallback and returns what the kernel
// sent, as "proto P SRC -> DST" strings.
func DumpOnly(d Dump, proto uint8) ([]string, error) {
	es, err := dumpEntries(ctDump{family: d.Family, filter: d.Filter, port: d.Port, extraFlags: d.ExtraFlags}, proto)
	var out []string
	for _, e := range es {
		out = append(out, e.String())
	}
	return out, err
}
