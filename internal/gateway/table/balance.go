package table

import (
	"sync"
	"sync/atomic"
)

// WRR is nginx's smooth weighted round robin over a fixed set of weights:
// each pick adds every weight to its current value, takes the largest and
// subtracts the total from it. Over any window of sum(weights) picks each
// index gets exactly its weight, interleaved (5,1,1 gives a a b a c a a),
// so a 70/30 split holds within a few requests, not only on average
// (the conformance suite's HTTPRouteWeight allows 5 %). Weight 0 is
// never picked. Safe for concurrent use.
type WRR struct {
	mu      sync.Mutex
	weights []int64
	current []int64
	total   int64
}

// NewWRR returns a balancer over weights; nil when every weight is 0
// (nothing can be picked).
func NewWRR(weights []int32) *WRR {
	w := &WRR{weights: make([]int64, len(weights)), current: make([]int64, len(weights))}
	for i, x := range weights {
		if x > 0 {
			w.weights[i] = int64(x)
			w.total += int64(x)
		}
	}
	if w.total == 0 {
		return nil
	}
	return w
}

// Pick returns the next index.
func (w *WRR) Pick() int {
	w.mu.Lock()
	defer w.mu.Unlock()
	best := -1
	for i, x := range w.weights {
		if x == 0 {
			continue
		}
		w.current[i] += x
		if best < 0 || w.current[i] > w.current[best] {
			best = i
		}
	}
	w.current[best] -= w.total
	return best
}

// Endpoint returns the next endpoint round robin, "" when there is none.
func (b *Backend) Endpoint() string {
	n := uint64(len(b.Endpoints))
	if n == 0 {
		return ""
	}
	return b.Endpoints[(atomic.AddUint64(&b.next, 1)-1)%n]
}

// EndpointOtherThan returns the next endpoint round robin that is not
// ep, "" when there is none. One turn of the counter, then a scan: with
// two endpoints, asking Endpoint twice can give ep both times when
// another request takes a turn in between.
func (b *Backend) EndpointOtherThan(ep string) string {
	n := uint64(len(b.Endpoints))
	if n == 0 {
		return ""
	}
	start := atomic.AddUint64(&b.next, 1) - 1
	for i := range n {
		if e := b.Endpoints[(start+i)%n]; e != ep {
			return e
		}
	}
	return ""
}
