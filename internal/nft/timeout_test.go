package nft

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"sigs.k8s.io/knftables"

	"github.com/flatnet/flatnet/internal/testutil"
)

// A stuck nft (here: a fake that hangs, with a child holding its stdout)
// must not hang its caller: the run ends at the deadline with an error
// that says what timed out and what to do, and Classify never sees it.
func TestRunTimesOut(t *testing.T) {
	testutil.HangingTool(t, "nft")
	n, err := New(knftables.InetFamily, "t")
	if err != nil {
		t.Fatal(err)
	}
	n.Classify = func(e *Error) error {
		t.Errorf("Classify called with %v", e)
		return e
	}
	tx := n.NewTransaction()
	tx.Add(&knftables.Table{})
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	start := time.Now()
	err = n.Run(ctx, tx)
	took := time.Since(start)
	t.Logf("returned after %s: %v", took, err)
	if took > 20*time.Second {
		t.Errorf("Run returned after %s, want about the 500ms deadline", took)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("err = %v, want context.DeadlineExceeded in the chain", err)
	}
	for _, want := range []string{"nft -f - did not finish within", "nft is stuck"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v does not say %q", err, want)
		}
	}
}
