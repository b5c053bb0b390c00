package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math"
	"os"
	"slices"
	"strconv"
	"strings"
)

// A result is one closed-loop dnsperf run against one server.
type result struct {
	Case   string `json:"case"`
	Server string `json:"server"`
	Run    int    `json:"run"`

	QPS       float64        `json:"qps"` // dnsperf's "Queries per second"
	Sent      int            `json:"sent"`
	Completed int            `json:"completed"`
	Lost      int            `json:"lost"`
	Rcodes    map[string]int `json:"rcodes"` // from the -v lines
	AvgMs     float64        `json:"avg_ms"`
	P50Ms     float64        `json:"p50_ms"`
	P99Ms     float64        `json:"p99_ms"`
	P999Ms    float64        `json:"p999_ms"`

	// From /proc/PID right after the run.
	RSSKiB int     `json:"rss_kib"`
	HWMKiB int     `json:"hwm_kib"`
	CPUS   float64 `json:"server_cpu_s"` // the server's CPU during the run
	// The upstream's CPU during the run: near zero when the server's
	// cache answers external names, a core's worth when it does not.
	UpstreamCPUS float64 `json:"upstream_cpu_s"`
	Duration     float64 `json:"run_s"`
}

// parseDnsperf reads dnsperf -v output: one "> RCODE name type latency"
// line per answered query, then the statistics block.
func parseDnsperf(r io.Reader) (result, error) {
	res := result{Rcodes: map[string]int{}}
	var lat []float64
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "> ") {
			f := strings.Fields(line)
			if len(f) != 5 {
				continue // a timed-out query ("> T ...") or a name with spaces: not a latency
			}
			s, err := strconv.ParseFloat(f[4], 64)
			if err != nil {
				return res, fmt.Errorf("dnsperf line %q: %w", line, err)
			}
			res.Rcodes[f[1]]++
			lat = append(lat, s)
			continue
		}
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if !ok {
			continue
		}
		v = strings.TrimSpace(v)
		first, _, _ := strings.Cut(v, " ")
		switch k {
		case "Queries sent":
			res.Sent, _ = strconv.Atoi(first)
		case "Queries completed":
			res.Completed, _ = strconv.Atoi(first)
		case "Queries lost":
			res.Lost, _ = strconv.Atoi(first)
		case "Queries per second":
			res.QPS, _ = strconv.ParseFloat(first, 64)
		case "Run time (s)":
			res.Duration, _ = strconv.ParseFloat(first, 64)
		}
	}
	if err := sc.Err(); err != nil {
		return res, err
	}
	if res.QPS == 0 || len(lat) == 0 {
		return res, fmt.Errorf("no statistics or no answered queries in dnsperf's output (was it run with -v?)")
	}
	slices.Sort(lat)
	sum := 0.0
	for _, l := range lat {
		sum += l
	}
	res.AvgMs = 1000 * sum / float64(len(lat))
	res.P50Ms, res.P99Ms, res.P999Ms = 1000*quantile(lat, 0.5), 1000*quantile(lat, 0.99), 1000*quantile(lat, 0.999)
	return res, nil
}

// quantile of sorted xs, nearest rank.
func quantile(xs []float64, q float64) float64 {
	i := int(math.Ceil(q*float64(len(xs)))) - 1
	return xs[max(0, min(i, len(xs)-1))]
}

// procStatus reads VmRSS and VmHWM (KiB) of pid.
func procStatus(pid int) (rss, hwm int, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, 0, fmt.Errorf("server's memory: %w", err)
	}
	for line := range strings.Lines(string(b)) {
		f := strings.Fields(line)
		if len(f) >= 2 && (f[0] == "VmRSS:" || f[0] == "VmHWM:") {
			n, _ := strconv.Atoi(f[1])
			if f[0] == "VmRSS:" {
				rss = n
			} else {
				hwm = n
			}
		}
	}
	return rss, hwm, nil
}

// parseCmd turns one run's output into a JSON line appended to -out, and
// fails when an answer had an rcode the case does not expect.
func parseCmd(args []string) error {
	fs := flag.NewFlagSet("parse", flag.ExitOnError)
	in := fs.String("in", "", "dnsperf -v output")
	out := fs.String("out", "", "append the result (JSON line) here")
	caseID := fs.String("case", "", "case ID")
	server := fs.String("server", "", "server name")
	run := fs.Int("run", 0, "run number")
	pid := fs.Int("pid", 0, "the server's PID, for its memory")
	cpuTicks := fs.Int("cpu-ticks", 0, "the server's CPU during the run, in clock ticks (1/100 s)")
	upTicks := fs.Int("upstream-cpu-ticks", 0, "the upstream's CPU during the run, in clock ticks")
	_ = fs.Parse(args)
	c, ok := caseByID(*caseID)
	if !ok {
		return fmt.Errorf("parse: unknown case %q", *caseID)
	}
	f, err := os.Open(*in)
	if err != nil {
		return err
	}
	res, err := parseDnsperf(f)
	f.Close()
	if err != nil {
		return fmt.Errorf("%s: %w", *in, err)
	}
	res.Case, res.Server, res.Run = c.ID, *server, *run
	res.CPUS, res.UpstreamCPUS = float64(*cpuTicks)/100, float64(*upTicks)/100
	if res.RSSKiB, res.HWMKiB, err = procStatus(*pid); err != nil {
		return err
	}
	line, err := json.Marshal(res)
	if err != nil {
		return err
	}
	o, err := os.OpenFile(*out, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o644)
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(o, "%s\n", line)
	if cerr := o.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return err
	}
	for rc, n := range res.Rcodes {
		if !slices.Contains(c.Want, rc) {
			return fmt.Errorf("case %s, %s, run %d: %d answers %s (want only %s): the server is misconfigured, not measured",
				c.ID, res.Server, res.Run, n, rc, strings.Join(c.Want, ", "))
		}
	}
	fmt.Printf("  %-10s %-8s run %d: %8.0f QPS, p50 %.2f ms, p99 %.2f ms, lost %d, CPU server %.1f s upstream %.1f s, RSS %.1f MiB\n",
		c.ID, res.Server, res.Run, res.QPS, res.P50Ms, res.P99Ms, res.Lost, res.CPUS, res.UpstreamCPUS, float64(res.RSSKiB)/1024)
	return nil
}
