package controller

import (
	"fmt"
	"slices"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
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
