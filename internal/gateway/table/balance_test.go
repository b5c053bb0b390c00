package table

import "testing"

func TestWRRSpreadsExactlyByWeight(t *testing.T) {
	for _, weights := range [][]int32{{70, 30, 0}, {5, 1, 1}, {1}, {0, 3, 0, 2}} {
		w := NewWRR(weights)
		window := 0
		for _, x := range weights {
			window += int(x)
		}
		got := make([]int, len(weights))
		for range 3 * window {
			got[w.Pick()]++
		}
		for i, x := range weights {
			if got[i] != 3*int(x) {
				t.Errorf("weights %v: index %d picked %d times in 3 windows, want %d (all %v)", weights, i, got[i], 3*x, got)
			}
		}
	}
}

func TestWRRInterleaves(t *testing.T) {
	w := NewWRR([]int32{5, 1, 1})
	var seq []int
	for range 7 {
		seq = append(seq, w.Pick())
	}
	want := []int{0, 0, 1, 0, 2, 0, 0}
	for i := range want {
		if seq[i] != want[i] {
			t.Fatalf("sequence %v, want nginx's smooth order %v", seq, want)
		}
	}
}

func TestWRRAllZeroIsNil(t *testing.T) {
	if NewWRR([]int32{0, 0}) != nil || NewWRR(nil) != nil {
		t.Fatal("a balancer with no positive weight should be nil")
	}
}

func TestBackendEndpointRoundRobin(t *testing.T) {
	b := &Backend{Endpoints: []string{"a", "b", "c"}}
	var got []string
	for range 4 {
		got = append(got, b.Endpoint())
	}
	if got[0] != "a" || got[1] != "b" || got[2] != "c" || got[3] != "a" {
		t.Fatalf("got %v", got)
	}
	if (&Backend{}).Endpoint() != "" {
		t.Fatal("no endpoints should give empty")
	}
}

// A redial after a failed endpoint must get another one whatever other
// requests do with the round robin meanwhile.
func TestBackendEndpointOtherThan(t *testing.T) {
	b := &Backend{Endpoints: []string{"a", "b", "c"}}
	seen := map[string]int{}
	for range 6 {
		seen[b.EndpointOtherThan("a")]++
	}
	if seen["a"] != 0 || seen["b"] == 0 || seen["c"] == 0 || seen[""] != 0 {
		t.Fatalf("EndpointOtherThan(a) over 6 turns gave %v, want b and c only", seen)
	}
	if got := (&Backend{Endpoints: []string{"a"}}).EndpointOtherThan("a"); got != "" {
		t.Fatalf("the only endpoint failed: got %q, want none", got)
	}
	if got := (&Backend{}).EndpointOtherThan("a"); got != "" {
		t.Fatalf("no endpoints: got %q", got)
	}

	two := &Backend{Endpoints: []string{"a", "b"}}
	stop := make(chan struct{})
	done := make(chan struct{})
	go func() { // other requests taking turns
		defer close(done)
		for {
			select {
			case <-stop:
				return
			default:
				two.Endpoint()
			}
		}
	}()
	bad := 0
	for range 100000 {
		if two.EndpointOtherThan("a") != "b" {
			bad++
		}
	}
	close(stop)
	<-done
	if bad > 0 {
		t.Fatalf("%d of 100000 redials beside concurrent requests got the failed endpoint again", bad)
	}
}
