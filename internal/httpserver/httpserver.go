// Package httpserver runs flatnet's small HTTP endpoints (metrics,
// /healthz and /livez, profiling) for as long as a context lives.
package httpserver

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/pprof"
	"time"
)

// Serve serves handler on addr (host:port) until ctx ends. A listen
// error is returned at once; the end of ctx returns nil.
func Serve(ctx context.Context, addr string, handler http.Handler) error {
	ln, err := Listen(addr)
	if err != nil {
		return err
	}
	return ServeListener(ctx, ln, handler)
}

// Listen listens on addr (host:port): for a daemon that must fail at its
// start, not some time later, when the address is taken. Serve the
// listener with ServeListener.
func Listen(addr string) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listening on %s: %w", addr, err)
	}
	return ln, nil
}

// ServeListener serves handler on ln until ctx ends, then closes ln; the
// end of ctx returns nil.
func ServeListener(ctx context.Context, ln net.Listener, handler http.Handler) error {
	srv := &http.Server{Handler: handler, ReadHeaderTimeout: 10 * time.Second}
	done := make(chan struct{})
	defer close(done)
	go func() {
		select {
		case <-ctx.Done():
			_ = srv.Close()
		case <-done:
		}
	}()
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return fmt.Errorf("serving on %s: %w", ln.Addr(), err)
	}
	return nil
}

// AddProfiling adds Go's /debug/pprof/ handlers (heap, CPU, goroutine and
// the other profiles) to mux: what --profiling turns on in the Kubernetes
// components, and in flatnet's.
func AddProfiling(mux *http.ServeMux) {
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
	mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
}

// CheckOK GETs url with client and wants 200 OK: the probe side of such
// endpoints (a daemon's /healthz or /readyz while it starts). The error
// names the path, the status and the start of the body.
func CheckOK(ctx context.Context, client *http.Client, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("%s: %s: %s", req.URL.Path, resp.Status, bytes.TrimSpace(body))
	}
	return nil
}
