package main

import (
	"bytes"
	"math"
	"net"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
)

func TestPingPongLoopback(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- Serve(l) }()
	rtts, err := Ping(PingOptions{Addr: l.Addr().String(), Size: 1000, Duration: 200 * time.Millisecond, Warmup: 20 * time.Millisecond})
	if err != nil {
		t.Fatal(err)
	}
	if len(rtts) < 10 {
		t.Fatalf("only %d round trips in 200ms over loopback", len(rtts))
	}
	rec := RRRecord("lo", 1, 1000, rtts)
	if rec.N != len(rtts) || rec.Kind != KindRR || !(rec.Minus > 0 && rec.Minus <= rec.P50us && rec.P50us <= rec.P99us && rec.P99us <= rec.Maxus) {
		t.Errorf("inconsistent summary %+v", rec)
	}
	l.Close()
	if err := <-done; err != nil {
		t.Errorf("Serve after close: %v", err)
	}
	if _, err := Ping(PingOptions{Addr: l.Addr().String(), Size: 1, Duration: time.Millisecond, Timeout: time.Second}); err == nil {
		t.Error("Ping to a closed listener succeeded")
	}
	if _, err := Ping(PingOptions{Addr: "127.0.0.1:1", Size: 0, Duration: time.Millisecond}); err == nil {
		t.Error("size 0 accepted")
	}
}

func TestPercentile(t *testing.T) {
	s := []float64{1, 2, 3, 4}
	for p, want := range map[float64]float64{0: 1, 50: 2.5, 100: 4, 99: 3.97} {
		if got := Percentile(s, p); math.Abs(got-want) > 1e-9 {
			t.Errorf("p%v = %v, want %v", p, got, want)
		}
	}
	if !math.IsNaN(Percentile(nil, 50)) {
		t.Error("p50 of nothing is not NaN")
	}
}

func TestParseIperf3(t *testing.T) {
	f, err := os.Open("testdata/iperf3-client.json")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	rec, err := ParseIperf3(f, "vxlan", 2)
	if err != nil {
		t.Fatal(err)
	}
	want := Record{Target: "vxlan", Rep: 2, Kind: KindTCP, BitsPerSec: 25905818910.08496, Seconds: 1.000133, Retrans: 26}
	if d := cmp.Diff(want, rec); d != "" {
		t.Errorf("record (-want +got):\n%s", d)
	}
	for _, bad := range []string{
		``, `{`, `{"end":{}}`,
		`{"start":{},"intervals":[],"end":{},"error":"unable to connect to server: Connection refused"}`,
	} {
		if _, err := ParseIperf3(strings.NewReader(bad), "x", 1); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
	_, err = ParseIperf3(strings.NewReader(`{"end":{},"error":"unable to connect"}`), "x", 1)
	if err == nil || !strings.Contains(err.Error(), "unable to connect") {
		t.Errorf("error %v does not carry iperf3's message", err)
	}
}

const results = `# a run
{"target":"host-gw","kind":"info","mtu":1500,"path":"pod to pod"}
{"target":"baseline","rep":1,"kind":"tcp","bps":10e9,"retransmits":2}
{"target":"host-gw","rep":1,"kind":"tcp","bps":8e9,"retransmits":0}
{"target":"baseline","rep":1,"kind":"rr","n":100,"p50_us":20,"p99_us":40}
{"target":"host-gw","rep":1,"kind":"rr","n":90,"p50_us":25,"p99_us":50}
{"target":"baseline","rep":2,"kind":"tcp","bps":12e9,"retransmits":4}
{"target":"host-gw","rep":2,"kind":"tcp","bps":6e9}
{"target":"baseline","rep":2,"kind":"rr","n":100,"p50_us":30,"p99_us":60}
{"target":"host-gw","rep":2,"kind":"rr","n":90,"p50_us":35,"p99_us":70}

{"target":"vxlan","rep":1,"kind":"tcp","bps":5e9}
`

func TestReport(t *testing.T) {
	recs, err := ReadRecords(strings.NewReader(results))
	if err != nil {
		t.Fatal(err)
	}
	rows := Summarize(recs)
	var got []string
	for _, r := range rows {
		got = append(got, r.Target)
	}
	if d := cmp.Diff([]string{"baseline", "host-gw", "vxlan"}, got); d != "" {
		t.Fatalf("order (-want +got):\n%s", d)
	}
	if b := rows[0]; b.Gbps != 11 || b.GbpsMin != 10 || b.GbpsMax != 12 || b.P50us != 25 || b.P99us != 50 || b.Retrans != 3 || b.RoundTrips != 200 {
		t.Errorf("baseline row %+v", b)
	}
	if h := rows[1]; h.Gbps != 7 || h.MTU != 1500 || h.Path != "pod to pod" || h.P50us != 30 {
		t.Errorf("host-gw row %+v", h)
	}
	var buf bytes.Buffer
	WriteTable(&buf, rows)
	out := buf.String()
	for _, want := range []string{
		"| baseline | - | 11.00 (10.00-12.00) | 1.00 | 3 | 25.0 | 1.00 | 50.0 | 1.00 |",
		"| host-gw (pod to pod) | 1500 | 7.00 (6.00-8.00) | 0.64 | 0 | 30.0 | 1.20 | 60.0 | 1.20 |",
		"| vxlan | - | 5.00 (5.00-5.00) | 0.45 | 0 | - | - | - | - |",
	} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	buf.Reset()
	WriteReps(&buf, recs)
	if !strings.Contains(buf.String(), "| 2 | host-gw | 6.00 | 0 | 35.0 | 70.0 | 90 |") {
		t.Errorf("reps table:\n%s", buf.String())
	}
}

func TestReadRecordsErrors(t *testing.T) {
	for _, bad := range []string{
		`{"kind":"tcp"}`,
		`{"target":"x","kind":"udp"}`,
		`{"target":"x","kind":"tcp","extra":1}`,
		"{\"target\":\"x\",\"kind\":\"tcp\"}\nnot json",
	} {
		_, err := ReadRecords(strings.NewReader(bad))
		if err == nil || !strings.Contains(err.Error(), "line ") {
			t.Errorf("%q: error %v, want one naming the line", bad, err)
		}
	}
}

func FuzzReport(f *testing.F) {
	f.Add(results)
	f.Add(`{"target":"baseline","kind":"tcp","bps":-1}`)
	f.Fuzz(func(t *testing.T, s string) {
		recs, err := ReadRecords(strings.NewReader(s))
		if err != nil {
			return
		}
		var buf bytes.Buffer
		rows := Summarize(recs)
		WriteTable(&buf, rows)
		WriteReps(&buf, recs)
		if len(recs) > 0 && len(rows) == 0 {
			t.Error("records but no rows")
		}
	})
}
