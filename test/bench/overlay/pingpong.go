package main

// The request/response pair: one TCP connection, TCP_NODELAY on both ends,
// the client writes Size bytes, the server echoes each read back, the
// client waits for all Size bytes before the next request. One round trip
// at a time, so each sample is a full network RTT plus two wakeups: what
// a small RPC between pods pays (netperf's TCP_RR).

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"math"
	"net"
	"os"
	"slices"
	"time"
)

// Serve accepts connections on l and echoes what each one sends until l
// is closed.
func Serve(l net.Listener) error {
	for {
		c, err := l.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return nil
			}
			return err
		}
		go func() {
			defer c.Close()
			if tc, ok := c.(*net.TCPConn); ok {
				_ = tc.SetNoDelay(true)
			}
			buf := make([]byte, 64*1024)
			for {
				n, err := c.Read(buf)
				if n > 0 {
					if _, werr := c.Write(buf[:n]); werr != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		}()
	}
}

func serveMain(args []string) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	listen := fs.String("listen", ":7000", "TCP address to listen on")
	if err := fs.Parse(args); err != nil {
		return err
	}
	l, err := net.Listen("tcp", *listen)
	if err != nil {
		return err
	}
	log.Printf("overlaybench: echoing on %s", l.Addr())
	return Serve(l)
}

// PingOptions say how long to run and what to send.
type PingOptions struct {
	Addr     string
	Size     int
	Duration time.Duration // measured time
	Warmup   time.Duration // round trips in this lead-in are not counted
	Timeout  time.Duration // per round trip, and for the connect
}

// Ping runs round trips on one connection for Warmup+Duration and returns
// the measured round-trip times.
func Ping(o PingOptions) ([]time.Duration, error) {
	if o.Size < 1 {
		return nil, fmt.Errorf("size %d: want at least 1 byte", o.Size)
	}
	if o.Timeout <= 0 {
		o.Timeout = 2 * time.Second
	}
	c, err := net.DialTimeout("tcp", o.Addr, o.Timeout)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	if tc, ok := c.(*net.TCPConn); ok {
		if err := tc.SetNoDelay(true); err != nil {
			return nil, err
		}
	}
	req := make([]byte, o.Size)
	for i := range req {
		req[i] = byte('a' + i%26)
	}
	resp := make([]byte, o.Size)
	// A rough size guess (20 µs per round trip) so append rarely grows
	// the slice while timing.
	rtts := make([]time.Duration, 0, int(o.Duration/(20*time.Microsecond))+1)
	start := time.Now()
	measureFrom := start.Add(o.Warmup)
	end := measureFrom.Add(o.Duration)
	if err := c.SetDeadline(end.Add(o.Timeout)); err != nil {
		return nil, err
	}
	for {
		t0 := time.Now()
		if !t0.Before(end) {
			break
		}
		if _, err := c.Write(req); err != nil {
			return nil, err
		}
		if _, err := io.ReadFull(c, resp); err != nil {
			return nil, err
		}
		d := time.Since(t0)
		if !t0.Before(measureFrom) {
			rtts = append(rtts, d)
		}
	}
	if len(rtts) == 0 {
		return nil, fmt.Errorf("no round trip completed in %s", o.Duration)
	}
	return rtts, nil
}

// RRRecord summarizes round-trip times in microseconds.
func RRRecord(target string, rep, size int, rtts []time.Duration) Record {
	us := make([]float64, len(rtts))
	var sum float64
	for i, d := range rtts {
		us[i] = float64(d) / float64(time.Microsecond)
		sum += us[i]
	}
	slices.Sort(us)
	rec := Record{Target: target, Rep: rep, Kind: KindRR, N: len(us), Size: size}
	if len(us) > 0 {
		rec.P50us = Percentile(us, 50)
		rec.P90us = Percentile(us, 90)
		rec.P99us = Percentile(us, 99)
		rec.Meanu = sum / float64(len(us))
		rec.Minus = us[0]
		rec.Maxus = us[len(us)-1]
	}
	return rec
}

// Percentile returns the p-th percentile (0..100) of sorted, interpolating
// linearly between closest ranks (numpy's default); NaN for no samples.
func Percentile(sorted []float64, p float64) float64 {
	n := len(sorted)
	switch {
	case n == 0:
		return math.NaN()
	case n == 1 || p <= 0:
		return sorted[0]
	case p >= 100:
		return sorted[n-1]
	}
	rank := p / 100 * float64(n-1)
	lo := int(math.Floor(rank))
	if lo+1 >= n {
		return sorted[n-1]
	}
	return sorted[lo] + (rank-float64(lo))*(sorted[lo+1]-sorted[lo])
}

func pingMain(args []string) error {
	fs := flag.NewFlagSet("ping", flag.ContinueOnError)
	var o PingOptions
	fs.StringVar(&o.Addr, "to", "", "server address host:port")
	fs.IntVar(&o.Size, "size", 64, "bytes per request (the answer is as large)")
	fs.DurationVar(&o.Duration, "duration", 5*time.Second, "measured time")
	fs.DurationVar(&o.Warmup, "warmup", 200*time.Millisecond, "lead-in whose round trips are not counted")
	fs.DurationVar(&o.Timeout, "timeout", 2*time.Second, "connect and per-round-trip timeout")
	target := fs.String("target", "", "label of the path measured (baseline, host-gw, vxlan, ...)")
	rep := fs.Int("rep", 0, "repetition number")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if o.Addr == "" || *target == "" {
		return errors.New("-to and -target are required")
	}
	rtts, err := Ping(o)
	if err != nil {
		return fmt.Errorf("%s: %w", o.Addr, err)
	}
	return writeRecord(os.Stdout, RRRecord(*target, *rep, o.Size, rtts))
}
