package gate

import (
	"context"
	"errors"
	"net/netip"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func serve(t *testing.T, h Handler) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "policy.sock")
	ctx, cancel := context.WithCancel(context.Background())
	s := &Server{Path: path, Handler: h}
	done := make(chan error, 1)
	go func() { done <- s.Serve(ctx) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("Serve: %v", err)
		}
	})
	deadline := time.Now().Add(5 * time.Second)
	for {
		// Wait for the listener: an empty request is refused, not unreachable.
		err := Ask(context.Background(), path, Request{})
		if err == nil || strings.Contains(err.Error(), "refused pod") {
			return path
		}
		if time.Now().After(deadline) {
			t.Fatalf("gate never listened: %v", err)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func TestAskReachesHandler(t *testing.T) {
	got := make(chan Request, 1)
	path := serve(t, func(_ context.Context, r Request) error {
		got <- r
		if r.Name == "bad" {
			return errors.New("no such pod")
		}
		return nil
	})
	req := Request{Namespace: "x", Name: "a", ContainerID: "c1", IPs: []netip.Addr{netip.MustParseAddr("10.244.1.5")}}
	if err := Ask(context.Background(), path, req); err != nil {
		t.Fatalf("Ask: %v", err)
	}
	if r := <-got; r.String() != "x/a" || len(r.IPs) != 1 || r.IPs[0] != req.IPs[0] || r.ContainerID != "c1" {
		t.Errorf("handler got %+v, want %+v", r, req)
	}
	req.Name = "bad"
	err := Ask(context.Background(), path, req)
	if err == nil || !strings.Contains(err.Error(), "no such pod") {
		t.Errorf("Ask for a refused pod: %v, want the handler's error", err)
	}
	<-got
}

func TestAskTimesOutAndNamesTheSocket(t *testing.T) {
	path := serve(t, func(ctx context.Context, r Request) error {
		if r.Name == "" {
			return errors.New("empty")
		}
		<-ctx.Done()
		return ctx.Err()
	})
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	err := Ask(ctx, path, Request{Namespace: "x", Name: "slow", IPs: []netip.Addr{netip.MustParseAddr("10.0.0.1")}})
	if err == nil || !strings.Contains(err.Error(), "did not confirm") {
		t.Errorf("Ask to a stuck agent: %v, want a timeout naming the pod", err)
	}
	err = Ask(context.Background(), filepath.Join(t.TempDir(), "none.sock"), Request{})
	if err == nil || !strings.Contains(err.Error(), "none.sock") {
		t.Errorf("Ask with no agent: %v, want an error naming the socket", err)
	}
}

func TestValidate(t *testing.T) {
	for _, r := range []Request{
		{},
		{Namespace: "x", Name: "a"},
		{Namespace: "x", Name: "a", IPs: []netip.Addr{{}}},
	} {
		if r.Validate() == nil {
			t.Errorf("Validate(%+v) = nil, want an error", r)
		}
	}
}
