package controller

import (
	"fmt"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/cache"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"

	"github.com/flatnet/flatnet/internal/gateway/compile"
)

func TestChanges(t *testing.T) {
	var ch changes
	hr := func(ns, name string) *gwv1.HTTPRoute {
		return &gwv1.HTTPRoute{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
	}
	ch.route("HTTPRoute", hr("a", "x"))
	ch.route("HTTPRoute", hr("a", "x"))
	ch.route("GRPCRoute", cache.DeletedFinalStateUnknown{Key: "b/y", Obj: nil})
	full, routes := ch.take()
	slices.SortFunc(routes, func(a, b compile.RouteKey) int { return cmpKey(a, b) })
	want := []compile.RouteKey{{Kind: "GRPCRoute", Namespace: "b", Name: "y"}, {Kind: "HTTPRoute", Namespace: "a", Name: "x"}}
	if full || !slices.Equal(routes, want) {
		t.Fatalf("take = %v %v, want false %v", full, routes, want)
	}
	if full, routes := ch.take(); full || routes != nil {
		t.Fatalf("second take = %v %v, want nothing", full, routes)
	}

	// Anything else, a key that cannot be read, or too many routes: full.
	ch.route("HTTPRoute", hr("a", "x"))
	ch.all()
	ch.route("HTTPRoute", hr("a", "z"))
	if full, routes := ch.take(); !full || routes != nil {
		t.Fatalf("after all: %v %v, want full", full, routes)
	}
	ch.route("HTTPRoute", 42)
	if full, _ := ch.take(); !full {
		t.Fatal("an object without a key did not ask for a full compile")
	}
	for i := range maxIncremental + 1 {
		ch.route("HTTPRoute", hr("a", fmt.Sprint(i)))
	}
	if full, routes := ch.take(); !full || routes != nil {
		t.Fatalf("%d routes: %v %d keys, want full", maxIncremental+1, full, len(routes))
	}
}

func cmpKey(a, b compile.RouteKey) int {
	return slices.Compare([]string{string(a.Kind), a.Namespace, a.Name}, []string{string(b.Kind), b.Namespace, b.Name})
}

func TestRelevantService(t *testing.T) {
	uses := func(ns, name string) bool { return ns == "a" && name == "web" }
	svc := func(ns, name string, labels map[string]string) *corev1.Service {
		return &corev1.Service{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels}}
	}
	slice := func(ns, name string, labels map[string]string) *discoveryv1.EndpointSlice {
		return &discoveryv1.EndpointSlice{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: labels}}
	}
	for _, c := range []struct {
		what string
		obj  any
		want serviceEvent
		key  string
	}{
		{"a backend's Service", svc("a", "web", nil), eventCompile, "a/web"},
		{"another Service", svc("a", "db", nil), eventNone, "a/db"},
		{"the same name elsewhere", svc("b", "web", nil), eventNone, "b/web"},
		{"a Gateway's frontend", svc("gw", "gw-front", map[string]string{LabelGateway: "gw"}), eventCompile, "gw/gw-front"},
		{"the Ingress frontend", svc("gw", IngressService, map[string]string{LabelIngress: "true"}), eventCompile, "gw/" + IngressService},
		{"a backend's slice", slice("a", "web-abc", map[string]string{discoveryv1.LabelServiceName: "web"}), eventCompile, "a/web"},
		{"another slice", slice("a", "db-abc", map[string]string{discoveryv1.LabelServiceName: "db"}), eventNone, "a/db"},
		{"a slice of ours", slice("gw", "gw-front-x", map[string]string{discoveryv1.LabelManagedBy: SliceManagedBy}), eventFrontend, "gw/gw-front-x"},
		{"a slice of ours a route names", slice("a", "web-x", map[string]string{discoveryv1.LabelManagedBy: SliceManagedBy, discoveryv1.LabelServiceName: "web"}), eventCompile, "a/web-x"},
		{"a slice without a Service", slice("a", "loose", nil), eventNone, "a/"},
		{"a tombstone", cache.DeletedFinalStateUnknown{Key: "a/web", Obj: svc("a", "web", nil)}, eventCompile, "a/web"},
		{"a tombstone of another", cache.DeletedFinalStateUnknown{Key: "a/db", Obj: slice("a", "db-x", map[string]string{discoveryv1.LabelServiceName: "db"})}, eventNone, "a/db"},
	} {
		k, got := relevantService(c.obj, uses)
		if got != c.want || k.String() != c.key {
			t.Errorf("%s: %v %s, want %v %s", c.what, got, k, c.want, c.key)
		}
	}
}

// An event let pass while a compile ran is looked at again once the
// compile's result is out: it asks for a full compile if it now matters.
func TestRecheck(t *testing.T) {
	var ch changes
	web := types.NamespacedName{Namespace: "a", Name: "web"}
	none := func(string, string) bool { return false }
	ch.skip(web, false)
	ch.skip(types.NamespacedName{}, true)
	if ch.recheck(none, false) {
		t.Fatal("nothing matters, yet recheck asked for a compile")
	}
	if full, _ := ch.take(); full {
		t.Fatal("take: full")
	}
	ch.skip(web, false)
	if !ch.recheck(func(ns, name string) bool { return ns == web.Namespace && name == web.Name }, false) {
		t.Fatal("a skipped Service now used: recheck did not ask for a compile")
	}
	if full, _ := ch.take(); !full {
		t.Fatal("take after recheck: not full")
	}
	if ch.recheck(func(string, string) bool { return true }, true) {
		t.Fatal("recheck remembered what the previous one looked at")
	}
	ch.skip(types.NamespacedName{}, true)
	if !ch.recheck(none, true) {
		t.Fatal("a skipped Node event with frontends: recheck did not ask for a compile")
	}
}
