package httpserver

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func TestServeUntilContextEnds(t *testing.T) {
	// A free port: listen, note it, close.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()

	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		errc <- Serve(ctx, addr, http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) { io.WriteString(w, "hi") }))
	}()
	var body string
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(20 * time.Millisecond) {
		resp, err := http.Get("http://" + addr + "/")
		if err != nil {
			continue
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		body = string(b)
		break
	}
	if body != "hi" {
		t.Fatalf("body %q, want hi", body)
	}
	cancel()
	select {
	case err := <-errc:
		if err != nil {
			t.Fatalf("Serve after cancel: %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("Serve did not return after its context ended")
	}
}

func TestServeListenError(t *testing.T) {
	err := Serve(context.Background(), "256.0.0.1:1", http.NotFoundHandler())
	if err == nil || !strings.Contains(err.Error(), "listening on 256.0.0.1:1") {
		t.Fatalf("err = %v, want a listen error naming the address", err)
	}
}

func TestCheckOK(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/healthz" {
			http.Error(w, "not ready yet", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok"))
	}))
	defer srv.Close()
	if err := CheckOK(context.Background(), srv.Client(), srv.URL+"/healthz"); err != nil {
		t.Errorf("/healthz: %v", err)
	}
	err := CheckOK(context.Background(), srv.Client(), srv.URL+"/readyz")
	if err == nil || !strings.Contains(err.Error(), "/readyz: 503") || !strings.Contains(err.Error(), "not ready yet") {
		t.Errorf("/readyz: %v", err)
	}
}

// A taken address fails Listen, naming it; ServeListener closes the
// listener when its context ends, so the address is free again.
func TestListenAndServeListener(t *testing.T) {
	ln, err := Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	if _, err := Listen(addr); err == nil || !strings.Contains(err.Error(), "listening on "+addr) {
		t.Fatalf("Listen on a taken address: %v, want an error naming %s", err, addr)
	}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- ServeListener(ctx, ln, http.NotFoundHandler()) }()
	// The listener accepts from the start: no waiting for the server.
	resp, err := http.Get("http://" + addr + "/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusNotFound {
		t.Errorf("GET /: %s", resp.Status)
	}
	cancel()
	if err := <-errc; err != nil {
		t.Fatalf("ServeListener after cancel: %v", err)
	}
	again, err := Listen(addr)
	if err != nil {
		t.Fatalf("the address after ServeListener returned: %v", err)
	}
	again.Close()
}

// AddProfiling serves Go's profiles under /debug/pprof/.
func TestAddProfiling(t *testing.T) {
	mux := http.NewServeMux()
	AddProfiling(mux)
	for path, want := range map[string]string{"/debug/pprof/": "goroutine", "/debug/pprof/cmdline": "httpserver.test", "/debug/pprof/heap?debug=1": "heap profile"} {
		rec := httptest.NewRecorder()
		mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		if rec.Code != http.StatusOK || !strings.Contains(rec.Body.String(), want) {
			t.Errorf("%s: %d, body without %q: %.200s", path, rec.Code, want, rec.Body)
		}
	}
}
