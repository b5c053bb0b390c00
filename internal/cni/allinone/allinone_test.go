package allinone

import (
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/flatnet/flatnet/internal/cni/cnierr"
	"github.com/flatnet/flatnet/internal/cni/plugin"
	"github.com/flatnet/flatnet/internal/netlinkx"
)

// recorder is fake stages that log each call as "verb stage" and check
// that a stage sees its own type.
type recorder struct {
	t     *testing.T
	mu    sync.Mutex // DEL runs stages at once
	calls []string
	fail  map[string]error // "verb stage" -> error
	// seen keeps each ADD's stdin, by stage.
	seen map[string]map[string]any
}

func (r *recorder) stage(name string) plugin.Stage {
	verb := func(v string) func(*skel.CmdArgs) error {
		return func(a *skel.CmdArgs) error {
			r.mu.Lock()
			defer r.mu.Unlock()
			r.calls = append(r.calls, v+" "+name)
			var conf map[string]any
			if err := json.Unmarshal(a.StdinData, &conf); err != nil || conf["type"] != name {
				r.t.Errorf("%s %s: stdin %s (%v), want type %q", v, name, a.StdinData, err, name)
			}
			return r.fail[v+" "+name]
		}
	}
	return plugin.Stage{
		Name: name,
		Add: func(a *skel.CmdArgs) (types.Result, error) {
			if err := verb("ADD")(a); err != nil {
				return nil, err
			}
			var conf map[string]any
			_ = json.Unmarshal(a.StdinData, &conf)
			r.mu.Lock()
			r.seen[name] = conf
			r.mu.Unlock()
			// Each stage adds one interface named after itself.
			res := &current.Result{CNIVersion: "1.1.0"}
			if prev, ok := conf["prevResult"]; ok {
				b, _ := json.Marshal(prev)
				_ = json.Unmarshal(b, res)
			}
			res.Interfaces = append(res.Interfaces, &current.Interface{Name: name})
			return res, nil
		},
		Del: verb("DEL"), Check: verb("CHECK"), GC: verb("GC"), Status: verb("STATUS"),
	}
}

func newRecorder(t *testing.T) (*recorder, *Chain) {
	r := &recorder{t: t, fail: map[string]error{}, seen: map[string]map[string]any{}}
	return r, New(r.stage("bridge"), r.stage("bandwidth"), r.stage("portmap"))
}

const conf = `{"cniVersion": "1.1.0", "name": "pods", "type": "flatnet", "bridge": "cni0",
  "ipam": {"type": "host-local"}, "ingressRate": 1000, "runtimeConfig": {"portMappings": [{"hostPort": 8080, "containerPort": 80, "protocol": "tcp"}]}}`

func args(stdin string) *skel.CmdArgs {
	return &skel.CmdArgs{ContainerID: "c1", Netns: "/var/run/netns/c1", IfName: "eth0", StdinData: []byte(stdin)}
}

func names(r types.Result) []string {
	res, err := current.NewResultFromResult(r)
	if err != nil {
		return []string{err.Error()}
	}
	var out []string
	for _, i := range res.Interfaces {
		out = append(out, i.Name)
	}
	return out
}

// ADD runs the stages in order, each with its own type, the whole config
// and the result of the stage before as prevResult.
func TestAddThreadsResults(t *testing.T) {
	r, c := newRecorder(t)
	res, err := c.Add(args(conf))
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"ADD bridge", "ADD bandwidth", "ADD portmap"}; !slices.Equal(r.calls, want) {
		t.Errorf("calls %v, want %v", r.calls, want)
	}
	if got, want := names(res), []string{"bridge", "bandwidth", "portmap"}; !slices.Equal(got, want) {
		t.Errorf("result's interfaces %v, want %v", got, want)
	}
	if _, ok := r.seen["bridge"]["prevResult"]; ok {
		t.Error("bridge got a prevResult the runtime did not give")
	}
	for _, s := range []string{"bandwidth", "portmap"} {
		if r.seen[s]["prevResult"] == nil || r.seen[s]["ingressRate"] != float64(1000) || r.seen[s]["runtimeConfig"] == nil || r.seen[s]["name"] != "pods" {
			t.Errorf("%s's config lacks prevResult, options or capabilities: %v", s, r.seen[s])
		}
	}
}

// A PassThrough stage (portmap) runs its ADD beside the stage before it,
// on the same prevResult, and that stage's result is the pair's; either
// failing undoes the pair and the stages before.
func TestAddPassThroughBeside(t *testing.T) {
	for _, failing := range []string{"", "ADD portmap", "ADD bandwidth"} {
		r := &recorder{t: t, fail: map[string]error{}, seen: map[string]map[string]any{}}
		if failing != "" {
			r.fail[failing] = errors.New(failing + " failed")
		}
		started := map[string]chan struct{}{"bandwidth": make(chan struct{}), "portmap": make(chan struct{})}
		meet := func(s plugin.Stage, other string) plugin.Stage {
			add := s.Add
			s.Add = func(a *skel.CmdArgs) (types.Result, error) {
				close(started[s.Name])
				select {
				case <-started[other]:
				case <-time.After(5 * time.Second):
					return nil, fmt.Errorf("%s did not start while %s ran", other, s.Name)
				}
				return add(a)
			}
			return s
		}
		portmap := meet(r.stage("portmap"), "bandwidth")
		portmap.PassThrough = true
		c := New(r.stage("bridge"), meet(r.stage("bandwidth"), "portmap"), portmap)
		res, err := c.Add(args(conf))
		if failing != "" {
			if err == nil || !strings.Contains(err.Error(), failing+" failed") {
				t.Errorf("%s: error %v", failing, err)
			}
			if got := slices.Sorted(slices.Values(r.calls[3:])); !slices.Equal(got, []string{"DEL bandwidth", "DEL bridge", "DEL portmap"}) {
				t.Errorf("%s: calls %v, want the three ADDs, then every stage's DEL", failing, r.calls)
			}
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if got, want := names(res), []string{"bridge", "bandwidth"}; !slices.Equal(got, want) {
			t.Errorf("result's interfaces %v, want bandwidth's result %v", got, want)
		}
		prev, _ := json.Marshal(r.seen["portmap"]["prevResult"])
		var pr current.Result
		if err := json.Unmarshal(prev, &pr); err != nil || len(pr.Interfaces) != 1 || pr.Interfaces[0].Name != "bridge" {
			t.Errorf("portmap's prevResult %s, want bridge's result", prev)
		}
	}
}

// A failed stage undoes the ones before it, last first, and the error
// keeps its CNI code.
func TestFailedAddUndoes(t *testing.T) {
	r, c := newRecorder(t)
	r.fail["ADD portmap"] = cnierr.New(cnierr.KernelFeatureMissing, "portmap: no nftables")
	_, err := c.Add(args(conf))
	if code, _ := cnierr.Code(err); code != cnierr.KernelFeatureMissing {
		t.Errorf("error %v: code %d, want %d", err, code, cnierr.KernelFeatureMissing)
	}
	// The undo takes bandwidth and bridge down at once: either order.
	if want := []string{"ADD bridge", "ADD bandwidth", "ADD portmap"}; len(r.calls) != 5 || !slices.Equal(r.calls[:3], want) ||
		!slices.Equal(slices.Sorted(slices.Values(r.calls[3:])), []string{"DEL bandwidth", "DEL bridge"}) {
		t.Errorf("calls %v, want %v, then DEL of bandwidth and bridge", r.calls, want)
	}
	// The undo's own failure is reported with the cause.
	r, c = newRecorder(t)
	r.fail["ADD bandwidth"] = errors.New("tc: boom")
	r.fail["DEL bridge"] = errors.New("veth: busy")
	if _, err := c.Add(args(conf)); err == nil || !strings.Contains(err.Error(), "tc: boom") || !strings.Contains(err.Error(), "veth: busy") {
		t.Errorf("error %v, want the cause and the undo's failure", err)
	}
}

// DEL and GC run every stage (DEL last first) even after a failure, and
// report them all; CHECK and STATUS stop at the first.
func TestVerbsAfterFailures(t *testing.T) {
	for _, tc := range []struct {
		verb      string
		run       func(*Chain, *skel.CmdArgs) error
		fail      string
		wantCalls []string
	}{
		{"DEL", (*Chain).Del, "DEL bandwidth", nil}, // see TestDelAtOnce for the order
		{"GC", (*Chain).GC, "GC bridge", []string{"GC bridge", "GC bandwidth", "GC portmap"}},
		{"CHECK", (*Chain).Check, "CHECK bandwidth", []string{"CHECK bridge", "CHECK bandwidth"}},
		{"STATUS", (*Chain).Status, "STATUS bridge", []string{"STATUS bridge"}},
	} {
		r, c := newRecorder(t)
		r.fail[tc.fail] = fmt.Errorf("%s failed", tc.fail)
		err := tc.run(c, args(conf))
		if err == nil || !strings.Contains(err.Error(), tc.fail+" failed") {
			t.Errorf("%s: error %v, want %q's", tc.verb, err, tc.fail)
		}
		if tc.wantCalls == nil {
			tc.wantCalls = delOrder(t, r.calls)
		}
		if !slices.Equal(r.calls, tc.wantCalls) {
			t.Errorf("%s: calls %v, want %v", tc.verb, r.calls, tc.wantCalls)
		}
		r.calls, r.fail = nil, nil
		if err := tc.run(c, args(conf)); err != nil {
			t.Errorf("%s without failures: %v", tc.verb, err)
		}
	}
}

func TestBrokenConfig(t *testing.T) {
	_, c := newRecorder(t)
	for _, stdin := range []string{"", "{", "null", "[1]"} {
		_, err := c.Add(args(stdin))
		if code, _ := cnierr.Code(err); code != cnierr.DecodingFailure {
			t.Errorf("ADD %q: %v (code %d), want code %d", stdin, err, code, cnierr.DecodingFailure)
		}
		if err := c.Del(args(stdin)); err == nil {
			t.Errorf("DEL %q: no error", stdin)
		}
	}
}

// delOrder checks that calls are the three stages' DELs, in any order,
// and returns them.
func delOrder(t *testing.T, calls []string) []string {
	t.Helper()
	want := []string{"DEL bandwidth", "DEL bridge", "DEL portmap"}
	if got := slices.Sorted(slices.Values(calls)); !slices.Equal(got, want) {
		t.Errorf("DEL calls %v, want %v in any order", calls, want)
	}
	return calls
}

// DEL runs every stage's Unhook (or Del) at once, removes the links the
// Unhooks handed over in one batch as soon as they have all returned
// (while portmap's Del still runs), and the Releases only once all of
// that has succeeded, and none after a failure.
func TestDelAtOnce(t *testing.T) {
	names := []string{"bridge", "bandwidth", "portmap"}
	for _, failing := range []string{"", "portmap", "flush"} {
		started := map[string]chan struct{}{}
		for _, n := range names {
			started[n] = make(chan struct{})
		}
		var mu sync.Mutex
		var log []string
		note := func(s string) { mu.Lock(); log = append(log, s); mu.Unlock() }
		down := func(name string) func(*skel.CmdArgs) error {
			return func(*skel.CmdArgs) error {
				defer note("down " + name)
				close(started[name])
				// Each waits for the others to have started: run one
				// after the other, the first gives up.
				for _, o := range names {
					select {
					case <-started[o]:
					case <-time.After(5 * time.Second):
						return fmt.Errorf("%s: %s did not start while %s ran", name, o, name)
					}
				}
				if name == failing {
					return fmt.Errorf("%s failed", name)
				}
				return nil
			}
		}
		// The stages with an Unhook hand their link to the batch.
		unhook := func(name string, index int) func(*skel.CmdArgs, netlinkx.LinkDeleter) error {
			return func(a *skel.CmdArgs, links netlinkx.LinkDeleter) error {
				if err := links.DeleteLink(index); err != nil {
					return err
				}
				return down(name)(a)
			}
		}
		batch := &fakeBatch{note: note, fail: failing == "flush"}
		newLinks = func(bool) linkBatch { return batch }
		saved := newLinks
		t.Cleanup(func() { newLinks = saved })
		stageDel := func(name string) func(*skel.CmdArgs) error {
			return func(*skel.CmdArgs) error { return fmt.Errorf("%s's Del called, not its Unhook", name) }
		}
		bridge := plugin.Stage{Name: "bridge", Del: stageDel("bridge"),
			Unhook: unhook("bridge", 7), Release: func(*skel.CmdArgs) error { note("release bridge"); return nil }}
		bandwidth := plugin.Stage{Name: "bandwidth", Del: stageDel("bandwidth"), Unhook: unhook("bandwidth", 9)}
		// portmap's Del returns only once the links are gone: the batch
		// must not wait for it.
		flushed := make(chan struct{})
		batch.flushed = flushed
		portmapDel := func(*skel.CmdArgs) error {
			close(started["portmap"])
			select {
			case <-flushed:
			case <-time.After(5 * time.Second):
				return errors.New("the links waited for portmap's Del")
			}
			note("down portmap")
			if failing == "portmap" {
				return errors.New("portmap failed")
			}
			return nil
		}
		c := New(bridge, bandwidth, plugin.Stage{Name: "portmap", Del: portmapDel})
		err := c.Del(args(conf))
		if failing == "" {
			if err != nil {
				t.Fatal(err)
			}
			want := []string{"down bridge", "down bandwidth", "flush [7 9]", "down portmap", "release bridge"}
			sorted := slices.Clone(log)
			if len(log) == 5 && log[1] == "down bridge" { // the two Unhooks return in either order
				sorted[0], sorted[1] = log[1], log[0]
			}
			if !slices.Equal(sorted, want) {
				t.Errorf("calls %v, want %v (bridge and bandwidth in either order)", log, want)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), failing+" failed") {
			t.Errorf("error %v, want %s's failure", err, failing)
		}
		if slices.Contains(log, "release bridge") {
			t.Errorf("calls %v: the address was released although %s failed", log, failing)
		}
	}
	// The failures come back last stage first, whatever the timing.
	newLinks = func(bool) linkBatch { return &fakeBatch{note: func(string) {}} }
	fail := func(name string) plugin.Stage {
		return plugin.Stage{Name: name, Del: func(*skel.CmdArgs) error {
			if name == "portmap" {
				time.Sleep(20 * time.Millisecond) // fails after the others
			}
			return cnierr.New(cnierr.Internal, "%s failed", name)
		}}
	}
	err := New(fail("bridge"), fail("bandwidth"), fail("portmap")).Del(args(conf))
	if err == nil || !strings.HasPrefix(err.Error(), "portmap failed\nbandwidth failed\nbridge failed") {
		t.Errorf("error %q, want portmap's, bandwidth's and bridge's failures in that order", err)
	}
}

// fakeBatch records the links handed to it and notes them when flushed.
type fakeBatch struct {
	mu      sync.Mutex
	links   []int
	note    func(string)
	fail    bool
	flushed chan struct{} // closed by Flush when set
}

func (b *fakeBatch) DeleteLink(index int) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.links = append(b.links, index)
	return nil
}

func (b *fakeBatch) Flush() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	slices.Sort(b.links)
	b.note(fmt.Sprintf("flush %v", b.links))
	if b.flushed != nil {
		close(b.flushed)
	}
	if b.fail {
		return errors.New("flush failed")
	}
	return nil
}
