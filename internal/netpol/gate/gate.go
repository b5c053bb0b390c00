// Package gate closes the first-packet window of network policy: the CNI
// plugin `flatnet-policy` (internal/cni/policygate), chained after the
// plugin that gives a pod its addresses, asks the node agent over a unix
// socket to commit the pod's policy for those addresses, and returns only
// when the agent says it has. The runtime starts the pod's containers after
// CNI ADD returns, so a pod selected by a policy never sends or receives a
// packet before its rules exist, and a default-deny namespace admits
// nothing from the first instant.
//
// Design. One request per connection, one JSON object each way, so a
// client is a dial, a write and a read with one deadline; the server runs
// each request in its own goroutine and answers with the handler's error.
// The agent learns the pod's addresses here before the kubelet writes them
// to the API (k8s #39113: that can take seconds), which is why the request
// carries them.
package gate

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"path/filepath"
	"sync"
	"time"

	"k8s.io/klog/v2"
)

// Request asks the agent to enforce a new pod's policy.
type Request struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// UID tells a pod from an earlier one of the same name (a
	// StatefulSet's); empty when the runtime does not pass K8S_POD_UID.
	UID         string       `json:"uid,omitempty"`
	ContainerID string       `json:"containerID,omitempty"`
	IPs         []netip.Addr `json:"ips"`
}

func (r Request) String() string { return r.Namespace + "/" + r.Name }

// Validate reports what is missing from a request.
func (r Request) Validate() error {
	switch {
	case r.Namespace == "" || r.Name == "":
		return errors.New("request without the pod's namespace and name")
	case len(r.IPs) == 0:
		return fmt.Errorf("request for pod %s without addresses", r)
	}
	for _, ip := range r.IPs {
		if !ip.IsValid() {
			return fmt.Errorf("request for pod %s with an invalid address", r)
		}
	}
	return nil
}

type response struct {
	Error string `json:"error,omitempty"`
}

// Ask sends req to the agent listening on socket and waits for its answer
// until ctx ends.
func Ask(ctx context.Context, socket string, req Request) error {
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", socket)
	if err != nil {
		return fmt.Errorf("reaching the flatnet agent's policy gate at %s: %w", socket, err)
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	stop := context.AfterFunc(ctx, func() { _ = conn.SetDeadline(time.Now()) })
	defer stop()
	if err := json.NewEncoder(conn).Encode(req); err != nil {
		return fmt.Errorf("sending to the policy gate at %s: %w", socket, err)
	}
	var resp response
	if err := json.NewDecoder(conn).Decode(&resp); err != nil {
		if ctx.Err() != nil || errors.Is(err, os.ErrDeadlineExceeded) {
			return fmt.Errorf("the flatnet agent did not confirm pod %s's policy in time: %w", req, err)
		}
		return fmt.Errorf("reading the policy gate's answer at %s: %w", socket, err)
	}
	if resp.Error != "" {
		return fmt.Errorf("the flatnet agent refused pod %s: %s", req, resp.Error)
	}
	return nil
}

// Handler enforces a request's pod policy and returns once it is
// committed to the kernel.
type Handler func(ctx context.Context, req Request) error

// Server answers gate requests on a unix socket.
type Server struct {
	Path    string
	Handler Handler
	// Timeout bounds one request (default 30 s).
	Timeout time.Duration
}

// Serve listens on s.Path (replacing a stale socket file) and serves until
// ctx ends; it removes the socket on return.
func (s *Server) Serve(ctx context.Context) error {
	if err := os.MkdirAll(filepath.Dir(s.Path), 0o755); err != nil {
		return fmt.Errorf("policy gate: %w", err)
	}
	// A socket left by a previous agent refuses connections; replace it.
	if err := os.Remove(s.Path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("policy gate: removing the stale socket: %w", err)
	}
	var lc net.ListenConfig
	ln, err := lc.Listen(ctx, "unix", s.Path)
	if err != nil {
		return fmt.Errorf("policy gate: %w", err)
	}
	// Only root (the runtime running CNI plugins) may ask.
	if err := os.Chmod(s.Path, 0o600); err != nil {
		ln.Close()
		return fmt.Errorf("policy gate: %w", err)
	}
	stop := context.AfterFunc(ctx, func() { ln.Close() })
	defer stop()
	defer os.Remove(s.Path)
	timeout := s.Timeout
	if timeout <= 0 {
		timeout = 30 * time.Second
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	for {
		conn, err := ln.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("policy gate: %w", err)
		}
		wg.Go(func() { s.serveConn(ctx, conn, timeout) })
	}
}

func (s *Server) serveConn(ctx context.Context, conn net.Conn, timeout time.Duration) {
	defer conn.Close()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	_ = conn.SetDeadline(time.Now().Add(timeout))
	var req Request
	var resp response
	err := json.NewDecoder(conn).Decode(&req)
	if err == nil {
		err = req.Validate()
	}
	if err == nil {
		err = s.Handler(ctx, req)
	}
	if err != nil {
		resp.Error = err.Error()
		klog.FromContext(ctx).Error(err, "Policy gate request failed", "pod", req.String())
	}
	_ = json.NewEncoder(conn).Encode(resp)
}
