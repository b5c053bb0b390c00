package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"strings"
)

// Kinds of Record.
const (
	KindRR   = "rr"   // request/response round trips (ping)
	KindTCP  = "tcp"  // bulk TCP throughput (iperf3)
	KindInfo = "info" // facts about a target (pod MTU)
)

// Record is one measurement (or fact) of one target, one JSON line in the
// results file.
type Record struct {
	Target string `json:"target"`
	Rep    int    `json:"rep,omitempty"`
	Kind   string `json:"kind"`

	// rr: round-trip times of one connection, in microseconds.
	N     int     `json:"n,omitempty"`
	P50us float64 `json:"p50_us,omitempty"`
	P90us float64 `json:"p90_us,omitempty"`
	P99us float64 `json:"p99_us,omitempty"`
	Meanu float64 `json:"mean_us,omitempty"`
	Minus float64 `json:"min_us,omitempty"`
	Maxus float64 `json:"max_us,omitempty"`
	Size  int     `json:"size,omitempty"` // request = response bytes

	// tcp: what the receiver got, and the sender's retransmits.
	BitsPerSec float64 `json:"bps,omitempty"`
	Retrans    int     `json:"retransmits,omitempty"`
	Seconds    float64 `json:"seconds,omitempty"`

	// info
	MTU  int    `json:"mtu,omitempty"`
	Path string `json:"path,omitempty"` // what the traffic crosses, for the table
}

// ReadRecords parses a results file: one JSON Record per line; blank lines
// and lines starting with # are skipped. Errors name the line.
func ReadRecords(r io.Reader) ([]Record, error) {
	var out []Record
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	line := 0
	for sc.Scan() {
		line++
		s := strings.TrimSpace(sc.Text())
		if s == "" || strings.HasPrefix(s, "#") {
			continue
		}
		var rec Record
		dec := json.NewDecoder(strings.NewReader(s))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&rec); err != nil {
			return nil, fmt.Errorf("line %d: %w", line, err)
		}
		if rec.Target == "" {
			return nil, fmt.Errorf("line %d: no target", line)
		}
		switch rec.Kind {
		case KindRR, KindTCP, KindInfo:
		default:
			return nil, fmt.Errorf("line %d: unknown kind %q (want rr, tcp or info)", line, rec.Kind)
		}
		out = append(out, rec)
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	return out, nil
}

func writeRecord(w io.Writer, rec Record) error {
	b, err := json.Marshal(rec)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(w, "%s\n", b)
	return err
}
