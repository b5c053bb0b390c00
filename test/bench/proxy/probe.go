package main

// The site's two helper processes (site.go): the endpoint server, which
// answers every connection with the address it was reached at, and the
// prober in the client namespace, which connects to ClusterIPs on the
// harness's request: "until one of these endpoints answers" (probe) or "as
// many new connections as you can" (load). Both are this binary, started
// inside their namespace by `ip netns exec`, so every socket they open is
// in it.

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// serveCmd accepts on *:port, writes the local address the connection came
// to (the endpoint it reached) and closes (serveRaw).
func serveCmd(args []string) error {
	fs := flag.NewFlagSet("serve", flag.ExitOnError)
	port := fs.Int("port", endpointPort, "port")
	_ = fs.Parse(args)
	return serveRaw(*port)
}

// probeReq is one request to the prober.
type probeReq struct {
	Op string `json:"op"` // "probe" or "load"

	// probe: connect to each target until one of its Want answers, at most
	// Tries times (Gap between tries), Par targets at a time, all within
	// Timeout.
	Targets []probeTarget `json:"targets,omitempty"`
	Tries   int           `json:"tries,omitempty"`
	Gap     time.Duration `json:"gap,omitempty"`
	Par     int           `json:"par,omitempty"`
	Timeout time.Duration `json:"timeout,omitempty"`

	// load: new connections to Addr (connect, then close with a reset),
	// Conc at a time, until Duration or Max connections.
	Addr     string        `json:"addr,omitempty"`
	Duration time.Duration `json:"duration,omitempty"`
	Max      int           `json:"max,omitempty"`
	Conc     int           `json:"conc,omitempty"`
}

type probeTarget struct {
	Addr string   `json:"addr"`
	Want []string `json:"want"`
}

type probeResp struct {
	Err string `json:"err,omitempty"`
	// probe: connections made in all.
	Tries int `json:"tries,omitempty"`
	// load: connections made, failed, seconds taken, connect latency
	// percentiles in seconds.
	N       int     `json:"n,omitempty"`
	Errors  int     `json:"errors,omitempty"`
	Seconds float64 `json:"seconds,omitempty"`
	P50     float64 `json:"p50,omitempty"`
	P99     float64 `json:"p99,omitempty"`
}

// proberCmd answers requests from stdin until EOF.
func proberCmd(args []string) error {
	in := bufio.NewScanner(os.Stdin)
	in.Buffer(make([]byte, 1<<20), 64<<20)
	out := json.NewEncoder(os.Stdout)
	for in.Scan() {
		var req probeReq
		var resp probeResp
		if err := json.Unmarshal(in.Bytes(), &req); err != nil {
			resp.Err = err.Error()
		} else {
			switch req.Op {
			case "probe":
				resp = probe(req)
			case "load":
				resp = loadRaw(req)
			default:
				resp.Err = fmt.Sprintf("unknown op %q", req.Op)
			}
		}
		if err := out.Encode(resp); err != nil {
			return err
		}
	}
	return in.Err()
}

// ask connects to addr and reads the endpoint's answer.
func ask(addr string) (string, error) {
	c, err := net.DialTimeout("tcp4", addr, time.Second)
	if err != nil {
		return "", err
	}
	defer c.Close()
	_ = c.SetReadDeadline(time.Now().Add(time.Second))
	b, err := io.ReadAll(io.LimitReader(c, 64))
	if err != nil {
		return "", err
	}
	if len(b) == 0 || b[len(b)-1] != '\n' {
		return "", fmt.Errorf("answer %q: not an endpoint's", b)
	}
	return string(b[:len(b)-1]), nil
}

func probe(req probeReq) probeResp {
	deadline := time.Now().Add(max(req.Timeout, time.Second))
	var tries atomic.Int64
	var mu sync.Mutex
	var errs []error
	idx := make(chan int)
	var wg sync.WaitGroup
	for range max(req.Par, 1) {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range idx {
				t := req.Targets[i]
				var last string
				var lastErr error
				ok := false
				for try := 0; try < max(req.Tries, 1) && time.Now().Before(deadline); try++ {
					if try > 0 && req.Gap > 0 {
						time.Sleep(req.Gap)
					}
					tries.Add(1)
					got, err := ask(t.Addr)
					last, lastErr = got, err
					if err == nil && slices.Contains(t.Want, got) {
						ok = true
						break
					}
				}
				if !ok {
					mu.Lock()
					errs = append(errs, fmt.Errorf("%s: none of %v answered (last answer %q, last error %v)", t.Addr, t.Want, last, lastErr))
					mu.Unlock()
				}
			}
		}()
	}
	for i := range req.Targets {
		idx <- i
	}
	close(idx)
	wg.Wait()
	resp := probeResp{Tries: int(tries.Load())}
	if len(errs) > 0 {
		resp.Err = fmt.Sprintf("%d of %d targets: %v", len(errs), len(req.Targets), errs[0])
	}
	return resp
}

// percentile is the nearest-rank percentile of sorted values (of 50, p99
// is the largest).
func percentile(sorted []float64, p float64) float64 {
	if len(sorted) == 0 {
		return 0
	}
	k := int(float64(len(sorted))*p/100+0.999999) - 1
	return sorted[min(max(k, 0), len(sorted)-1)]
}
