package agent

import (
	"fmt"
	"net/netip"
	"strings"
	"testing"

	"github.com/go-logr/logr/funcr"

	"github.com/flatnet/flatnet/internal/agent/backend"
	"github.com/flatnet/flatnet/internal/agent/routes"
)

// TestLogApplyCountsBigChanges: a few route changes get a line each; an
// agent starting among thousands of peers gets one line that counts them,
// and a line each only at -v=2.
func TestLogApplyCountsBigChanges(t *testing.T) {
	res := func(n int) backend.Result {
		var r backend.Result
		for i := range n {
			r.Routes.Replace = append(r.Routes.Replace, routes.Route{
				Dst:  netip.PrefixFrom(netip.AddrFrom4([4]byte{10, 128 + byte(i/256), byte(i), 0}), 24),
				Gw:   netip.AddrFrom4([4]byte{10, 252, byte(i / 250), byte(i%250 + 1)}),
				Node: fmt.Sprintf("n%d", i),
			})
		}
		return r
	}
	for _, tc := range []struct {
		routes, verbosity, lines int
		want                     string
	}{
		{routes: 3, lines: 3, want: `"node"="n2"`},
		{routes: logEachMax, lines: logEachMax},
		{routes: 5000, lines: 1, want: `"count"=5000`},
		{routes: 5000, verbosity: 2, lines: 5001, want: `"node"="n4999"`},
	} {
		var lines []string
		logger := funcr.New(func(prefix, args string) { lines = append(lines, args) }, funcr.Options{Verbosity: tc.verbosity})
		logApply(logger, res(tc.routes))
		if len(lines) != tc.lines || !strings.Contains(strings.Join(lines, "\n"), tc.want) {
			t.Errorf("%d routes at -v=%d: %d lines, want %d with %s; first: %q", tc.routes, tc.verbosity, len(lines), tc.lines, tc.want, lines[:min(2, len(lines))])
		}
	}
}
