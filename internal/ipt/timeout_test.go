package ipt

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/flatnet/flatnet/internal/testutil"
)

// A stuck iptables-restore (here: a fake that hangs, with a child holding
// its stdout, as one waiting on a held xtables lock would) must not hang
// its caller: the run ends at the deadline with an error that says what
// timed out and what to do.
func TestRestoreTimesOut(t *testing.T) {
	testutil.HangingTool(t, "iptables-restore")
	ctx, cancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
	defer cancel()
	start := time.Now()
	err := New().Restore(ctx, IPv4, NewBuilder("nat").Bytes())
	took := time.Since(start)
	t.Logf("returned after %s: %v", took, err)
	if took > 20*time.Second {
		t.Errorf("Restore returned after %s, want about the 500ms deadline", took)
	}
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("err = %v, want context.DeadlineExceeded in the chain", err)
	}
	for _, want := range []string{"iptables-restore --noflush -w did not finish within", "xtables lock"} {
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("error %v does not say %q", err, want)
		}
	}
}
