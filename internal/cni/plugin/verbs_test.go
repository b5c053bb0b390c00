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

func TestValidAttachments(t *testing.T) {
	keep := Attachment{ContainerID: "c1", IfName: "eth0"}
	other := Attachment{ContainerID: "c2", IfName: "net1"}
	for _, tt := range []struct {
		name, stdin string
		want        map[Attachment]bool
		code        uint // 0: success
	}{
		{"spec key", `{"cni.dev/valid-attachments":[{"containerID":"c1","ifname":"eth0"}]}`, map[Attachment]bool{keep: true}, 0},
		{"alias key", `{"cni.dev/attachments":[{"containerID":"c1","ifname":"eth0"}]}`, map[Attachment]bool{keep: true}, 0},
		{"both, union", `{"cni.dev/valid-attachments":[{"containerID":"c1","ifname":"eth0"}],"cni.dev/attachments":[{"containerID":"c2","ifname":"net1"}]}`,
			map[Attachment]bool{keep: true, other: true}, 0},
		// libcni sends null for a nil list: nothing is in use.
		{"null list", `{"cni.dev/valid-attachments":null,"cni.dev/attachments":null}`, map[Attachment]bool{}, 0},
		{"empty list", `{"cni.dev/valid-attachments":[]}`, map[Attachment]bool{}, 0},
		{"no key", `{"cniVersion":"1.1.0","name":"n"}`, nil, cnierr.InvalidConfig},
		{"wrong type", `{"cni.dev/valid-attachments":{"containerID":"c1"}}`, nil, cnierr.DecodingFailure},
		{"not json", `{`, nil, cnierr.DecodingFailure},
	} {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ValidAttachments([]byte(tt.stdin))
			if tt.code != 0 {
				code, _ := cnierr.Code(err)
				if code != tt.code {
					t.Fatalf("err = %v (code %d), want code %d", err, code, tt.code)
				}
				if tt.code == cnierr.InvalidConfig && !strings.Contains(err.Error(), "cni.dev/valid-attachments") {
					t.Errorf("error %q does not name the missing key", err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if len(got) != len(tt.want) {
				t.Fatalf("got %v, want %v", got, tt.want)
			}
			for a := range tt.want {
				if !got[a] {
					t.Errorf("got %v, want %v", got, tt.want)
				}
			}
		})
	}
}
