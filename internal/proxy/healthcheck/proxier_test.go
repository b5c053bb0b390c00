package healthcheck

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes/fake"
)

type clock struct{ t time.Time }

func (c *clock) now() time.Time       { return c.t }
func (c *clock) step(d time.Duration) { c.t = c.t.Add(d) }
func newClock() *clock                { return &clock{t: time.Date(2030, 1, 2, 3, 4, 5, 0, time.UTC)} }

type answer struct {
	code int
	body map[string]any
}

func get(t *testing.T, h http.Handler, path string) answer {
	t.Helper()
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
	var body map[string]any
	if err := json.Unmarshal(rec.Body.Bytes(), &body); err != nil {
		t.Fatalf("%s: body %q is not JSON: %v", path, rec.Body, err)
	}
	if ct := rec.Header().Get("Content-Type"); ct != "application/json" {
		t.Errorf("%s: Content-Type %q", path, ct)
	}
	return answer{rec.Code, body}
}

func TestProxierHealth(t *testing.T) {
	c := newClock()
	var served []string
	h := NewProxierHealth(ProxierHealthConfig{NodeName: "node-a", Timeout: time.Minute, Now: c.now,
		Served: func(path string, code int) { served = append(served, path+" "+http.StatusText(code)) }})
	v4, v6 := h.Family("IPv4"), h.Family("IPv6")
	handler := h.Handler()
	check := func(what string, wantHealthz, wantLivez int) (answer, answer) {
		t.Helper()
		hz, lz := get(t, handler, "/healthz"), get(t, handler, "/livez")
		if hz.code != wantHealthz || lz.code != wantLivez {
			t.Errorf("%s: /healthz %d, /livez %d; want %d, %d", what, hz.code, lz.code, wantHealthz, wantLivez)
		}
		return hz, lz
	}

	// Starting up, nothing queued: healthy.
	hz, lz := check("at start", 200, 200)
	now := c.t.Format(time.RFC3339Nano)
	want := map[string]any{"lastUpdated": now, "currentTime": now, "nodeName": "node-a", "nodeHealthy": true, "nodeEligible": true}
	for k, v := range want {
		if hz.body[k] != v {
			t.Errorf("/healthz %s = %v, want %v (body %v)", k, hz.body[k], v, hz.body)
		}
	}
	if _, ok := lz.body["nodeHealthy"]; ok || lz.body["nodeName"] != "node-a" {
		t.Errorf("/livez body %v: want nodeName and no node health", lz.body)
	}

	// A queued change not yet synced is fine until the timeout...
	v4.QueuedUpdate()
	c.step(59 * time.Second)
	check("queued 59s ago", 200, 200)
	// ...a later queue does not reset the oldest...
	v4.QueuedUpdate()
	c.step(time.Second)
	hz, _ = check("queued 60s ago", 503, 503)
	if hz.body["lastUpdated"] != "0001-01-01T00:00:00Z" || hz.body["currentTime"] != c.t.Format(time.RFC3339Nano) {
		t.Errorf("unhealthy body %v: want the never-updated lastUpdated and now", hz.body)
	}
	if h.IsHealthy() {
		t.Error("IsHealthy while a change waits past the timeout")
	}
	// ...and a sync clears it.
	v4.Updated()
	check("after the sync", 200, 200)

	// Health is the AND of the families.
	v6.QueuedUpdate()
	c.step(2 * time.Minute)
	hz, _ = check("IPv6 lagging", 503, 503)
	if hz.body["lastUpdated"] != "0001-01-01T00:00:00Z" {
		t.Errorf("lastUpdated %v: want the failing family's (never)", hz.body["lastUpdated"])
	}
	v6.Updated()
	check("both synced", 200, 200)

	// A Node being deleted or tainted by the autoscaler fails /healthz
	// (load balancers drain it), not /livez.
	h.SyncNode(&v1.Node{Spec: v1.NodeSpec{Taints: []v1.Taint{{Key: ToBeDeletedTaint, Effect: v1.TaintEffectNoSchedule}}}})
	hz, _ = check("tainted for deletion", 503, 200)
	if hz.body["nodeHealthy"] != false {
		t.Errorf("nodeHealthy %v while tainted", hz.body["nodeHealthy"])
	}
	if !h.IsHealthy() {
		t.Error("IsHealthy counts the Node's state")
	}
	h.SyncNode(&v1.Node{})
	check("taint removed", 200, 200)
	h.SyncNode(&v1.Node{ObjectMeta: metav1.ObjectMeta{DeletionTimestamp: &metav1.Time{Time: c.t}}})
	check("being deleted", 503, 200)

	if len(served) == 0 || served[0] != "/healthz OK" || served[1] != "/livez OK" {
		t.Errorf("Served hook calls: %v", served)
	}
	var none *Family
	none.QueuedUpdate()
	none.Updated()
}

func TestWatchNode(t *testing.T) {
	client := fake.NewClientset(&v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"},
		Spec: v1.NodeSpec{Taints: []v1.Taint{{Key: ToBeDeletedTaint}}}})
	h := NewProxierHealth(ProxierHealthConfig{NodeName: "node-a", Timeout: time.Minute})
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- h.WatchNode(ctx, client) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			t.Error(err)
		}
	}()
	waitFor(t, "the tainted Node is not eligible", func() bool { return !h.eligible() })
	if _, err := client.CoreV1().Nodes().Update(ctx, &v1.Node{ObjectMeta: metav1.ObjectMeta{Name: "node-a"}}, metav1.UpdateOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "the untainted Node is eligible", h.eligible)
	if err := client.CoreV1().Nodes().Delete(ctx, "node-a", metav1.DeleteOptions{}); err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a deleted Node is not eligible", func() bool { return !h.eligible() })
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s: never happened", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
