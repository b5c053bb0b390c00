package endpointslice

import (
	"math/rand/v2"
	"testing"

	corev1 "k8s.io/api/core/v1"
	discovery "k8s.io/api/discovery/v1"
	apiequality "k8s.io/apimachinery/pkg/api/equality"
	"k8s.io/utils/ptr"
)

// randomEndpoint draws every field from a few choices, nil and empty
// among them, so that pairs are often equal and differ in one field.
func randomEndpoint(r *rand.Rand) discovery.Endpoint {
	pick := func(n int) int { return r.IntN(n) }
	str := func() *string {
		return []*string{nil, ptr.To(""), ptr.To("a"), ptr.To("b")}[pick(4)]
	}
	boolp := func() *bool { return []*bool{nil, ptr.To(true), ptr.To(false)}[pick(3)] }
	e := discovery.Endpoint{
		Addresses:          [][]string{nil, {}, {"10.0.0.1"}, {"10.0.0.2"}, {"10.0.0.1", "10.0.0.2"}}[pick(5)],
		Conditions:         discovery.EndpointConditions{Ready: boolp(), Serving: boolp(), Terminating: boolp()},
		Hostname:           str(),
		NodeName:           str(),
		Zone:               str(),
		DeprecatedTopology: []map[string]string{nil, {}, {"k": "v"}, {"k": "w"}}[pick(4)],
	}
	switch pick(4) {
	case 1:
		e.TargetRef = &corev1.ObjectReference{Kind: "Pod", Namespace: "ns", Name: "p"}
	case 2:
		e.TargetRef = &corev1.ObjectReference{Kind: "Pod", Namespace: "ns", Name: "p", UID: "u"}
	case 3:
		e.TargetRef = &corev1.ObjectReference{}
	}
	switch pick(5) {
	case 1:
		e.Hints = &discovery.EndpointHints{}
	case 2:
		e.Hints = &discovery.EndpointHints{ForZones: []discovery.ForZone{}}
	case 3:
		e.Hints = &discovery.EndpointHints{ForZones: []discovery.ForZone{{Name: "z"}}}
	case 4:
		e.Hints = &discovery.EndpointHints{ForNodes: []discovery.ForNode{{Name: "n"}}}
	}
	return e
}

// endpointEqual says what apiequality.Semantic.DeepEqual says, for
// random pairs and for endpoints and deep copies of them.
func TestEndpointEqualIsSemanticDeepEqual(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	equal := 0
	for i := range 200000 {
		a, b := randomEndpoint(r), randomEndpoint(r)
		if i%4 == 0 {
			b = *a.DeepCopy()
		}
		want := apiequality.Semantic.DeepEqual(a, b)
		if got := endpointEqual(&a, &b); got != want {
			t.Fatalf("endpointEqual(%+v, %+v) = %v, Semantic.DeepEqual says %v", a, b, got, want)
		}
		if want {
			equal++
		}
	}
	if equal < 50000 {
		t.Fatalf("only %d equal pairs: the test draws too few", equal)
	}
}

// BenchmarkEndpointEqual: one endpoint as a sync compares it, the one it
// wants against its slice's (equal, each with allocations of its own).
func BenchmarkEndpointEqual(b *testing.B) {
	s := decodedSlice(b, 1, 1)
	want, have := s.Endpoints[0], *s.Endpoints[0].DeepCopy()
	b.Run("Semantic.DeepEqual", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if !apiequality.Semantic.DeepEqual(want, have) {
				b.Fatal("unequal")
			}
		}
	})
	b.Run("endpointEqual", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			if !endpointEqual(&want, &have) {
				b.Fatal("unequal")
			}
		}
	})
}
