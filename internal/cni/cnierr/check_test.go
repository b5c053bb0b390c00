package cnierr

import (
	"errors"
	"testing"
)

func TestMismatch(t *testing.T) {
	if Mismatch("ptp", nil) != nil {
		t.Error("no problems, yet an error")
	}
	err := Mismatch("ptp", []string{"a", "b"})
	if code, _ := Code(err); code != CheckFailed || err.Error() != "ptp: a; b" {
		t.Errorf("Mismatch = %v (code %d)", err, code)
	}
}

func TestAddFinding(t *testing.T) {
	var problems []string
	if err := AddFinding(&problems, nil); err != nil || problems != nil {
		t.Fatal("nil error")
	}
	if err := AddFinding(&problems, New(CheckFailed, "rule missing")); err != nil || len(problems) != 1 || problems[0] != "rule missing" {
		t.Errorf("106: %v, %v", err, problems)
	}
	other := errors.New("nft failed")
	if err := AddFinding(&problems, other); err != other || len(problems) != 1 {
		t.Errorf("other error: %v, %v", err, problems)
	}
}
