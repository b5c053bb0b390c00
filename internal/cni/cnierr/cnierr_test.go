package cnierr

import (
	"context"
	"fmt"
	"testing"
)

func TestCodes(t *testing.T) {
	timeout := fmt.Errorf("nft -f - did not finish: %w", context.DeadlineExceeded)
	for _, tc := range []struct {
		name string
		err  error
		want uint
	}{
		{"uncoded", fmt.Errorf("boom"), Internal},
		{"coded", Wrap(IOFailure, fmt.Errorf("boom"), "disk"), IOFailure},
		{"timed out", fmt.Errorf("ipMasq: %w", timeout), TryAgainLater},
		{"timed out inside a coded error", Wrap(CheckFailed, timeout, "CHECK"), CheckFailed},
	} {
		if got := ToTypes(tc.err).Code; got != tc.want {
			t.Errorf("%s: code %d, want %d", tc.name, got, tc.want)
		}
	}
}
