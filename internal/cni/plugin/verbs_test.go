package plugin

import (
	"errors"
	"path/filepath"
	"strings"
	"testing"

	"github.com/containernetworking/cni/pkg/types"

	"github.com/flatnet/flatnet/internal/cni/cnierr"
)

func TestUndo(t *testing.T) {
	var order []int
	var u Undo
	u.Push(func() error { order = append(order, 1); return nil })
	u.Push(func() error { order = append(order, 2); return errors.New("two failed") })
	u.Push(func() error { order = append(order, 3); return nil })

	var ok error
	u.OnError(&ok)
	if ok != nil || order != nil {
		t.Fatalf("OnError after success ran %v: %v", order, ok)
	}
	failed := cnierr.New(cnierr.InvalidConfig, "step 4")
	err := failed
	u.OnError(&err)
	if len(order) != 3 || order[0] != 3 || order[2] != 1 {
		t.Errorf("undo order %v, want newest first", order)
	}
	if !errors.Is(err, failed) || !strings.Contains(err.Error(), "undoing the ADD failed: two failed") {
		t.Errorf("err = %v", err)
	}
	if code, _ := cnierr.Code(err); code != cnierr.InvalidConfig {
		t.Errorf("code %d, want the failed step's", code)
	}
}

func TestCheckNetNS(t *testing.T) {
	for path, want := range map[string]uint{
		"":                                 cnierr.InvalidEnvironment,
		filepath.Join(t.TempDir(), "gone"): cnierr.UnknownContainer,
	} {
		if code, _ := cnierr.Code(CheckNetNS(path)); code != want {
			t.Errorf("CheckNetNS(%q): code %d, want %d", path, code, want)
		}
	}
}

func TestLoadPrevResult(t *testing.T) {
	conf := &types.NetConf{CNIVersion: "1.0.0"}
	if r, err := LoadPrevResult(conf); r != nil || err != nil {
		t.Errorf("no prevResult: %v, %v", r, err)
	}
	conf.RawPrevResult = map[string]any{"cniVersion": "1.0.0", "ips": []any{map[string]any{"address": "10.1.0.5/24"}}}
	r, err := LoadPrevResult(conf)
	if err != nil || len(r.IPs) != 1 || r.IPs[0].Address.String() != "10.1.0.5/24" {
		t.Errorf("LoadPrevResult = %+v, %v", r, err)
	}
	conf = &types.NetConf{CNIVersion: "1.0.0", RawPrevResult: map[string]any{"cniVersion": "1.0.0", "ips": "nope"}}
	if _, err := LoadPrevResult(conf); err == nil {
		t.Error("bad prevResult accepted")
	} else if code, _ := cnierr.Code(err); code != cnierr.DecodingFailure {
		t.Errorf("bad prevResult: code %d", code)
	}
}
