package process

import (
	"context"
	"errors"
	"fmt"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	v1 "k8s.io/api/core/v1"
)

// Fakes for the runtime's effects: the unit tests drive a whole pod
// lifecycle through them with a fake clientset.

type fakeNet struct {
	mu       sync.Mutex
	readyErr error
	addErr   error
	delErr   error
	adds     []cniAttachment
	dels     []cniAttachment
	attached map[string]string // sandbox ID -> IP
	cache    map[string]cniAttachment
	n        int
}

func newFakeNet() *fakeNet {
	return &fakeNet{attached: map[string]string{}, cache: map[string]cniAttachment{}}
}

func (f *fakeNet) ready() error {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.readyErr
}

func (f *fakeNet) setReady(err error) {
	f.mu.Lock()
	f.readyErr = err
	f.mu.Unlock()
}

func (f *fakeNet) setAddErr(err error) {
	f.mu.Lock()
	f.addErr = err
	f.mu.Unlock()
}

func (f *fakeNet) add(_ context.Context, a cniAttachment) ([]string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.adds = append(f.adds, a)
	if f.addErr != nil {
		return nil, f.addErr
	}
	f.n++
	ip := fmt.Sprintf("10.244.1.%d", f.n+1)
	f.attached[a.SandboxID] = ip
	f.cache[a.SandboxID] = a
	return []string{ip}, nil
}

func (f *fakeNet) del(_ context.Context, a cniAttachment) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.dels = append(f.dels, a)
	if f.delErr != nil {
		return f.delErr
	}
	delete(f.attached, a.SandboxID)
	delete(f.cache, a.SandboxID)
	return nil
}

func (f *fakeNet) cached(namespace, name string) ([]cniAttachment, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	var out []cniAttachment
	for _, a := range f.cache {
		if argValue(a.Args, "K8S_POD_NAMESPACE") == namespace && argValue(a.Args, "K8S_POD_NAME") == name {
			out = append(out, a)
		}
	}
	return out, nil
}

func (f *fakeNet) snapshot() (adds, dels []cniAttachment, attached int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]cniAttachment(nil), f.adds...), append([]cniAttachment(nil), f.dels...), len(f.attached)
}

type fakeNS struct {
	mu sync.Mutex
	m  map[string]bool
}

func newFakeNS() *fakeNS { return &fakeNS{m: map[string]bool{}} }

func (f *fakeNS) create(name string) (string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.m[name] {
		return "", errors.New("exists")
	}
	f.m[name] = true
	return filepath.Join(netnsRunDir, name), nil
}

func (f *fakeNS) remove(name string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	delete(f.m, name)
	return nil
}

func (f *fakeNS) exists(name string) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.m[name]
}

func (f *fakeNS) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.m)
}

type fakeProc struct {
	spec       procSpec
	id         procID
	exits      chan exitInfo
	alive      bool
	signals    []syscall.Signal
	exitOnTerm bool
}

type fakeProcs struct {
	mu         sync.Mutex
	next       int
	procs      []*fakeProc
	exitOnTerm bool // new processes exit on SIGTERM
	netnsKills []string
	netnsStuck bool // killNetns fails: a process survives it
}

func newFakeProcs() *fakeProcs { return &fakeProcs{next: 1000} }

func (f *fakeProcs) start(spec procSpec) (procID, <-chan exitInfo, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.next++
	p := &fakeProc{spec: spec, id: procID{PID: f.next, StartTicks: 7, MntNS: uint64(f.next)}, exits: make(chan exitInfo, 1), alive: true, exitOnTerm: f.exitOnTerm}
	f.procs = append(f.procs, p)
	return p.id, p.exits, nil
}

// add makes a live process as if an earlier agent had started it.
func (f *fakeProcs) add(id procID) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.procs = append(f.procs, &fakeProc{id: id, alive: true, exits: make(chan exitInfo, 1)})
}

func (f *fakeProcs) find(id procID) *fakeProc {
	for _, p := range f.procs {
		if p.id == id {
			return p
		}
	}
	return nil
}

func (f *fakeProcs) exitLocked(p *fakeProc, e exitInfo) {
	if !p.alive {
		return
	}
	p.alive = false
	e.At = time.Now()
	p.exits <- e
}

// exit ends the live process of container name (by its log path).
func (f *fakeProcs) exit(container string, code int32) bool {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, p := range f.procs {
		if p.alive && filepath.Base(filepath.Dir(p.spec.LogPath)) == container {
			f.exitLocked(p, exitInfo{Code: code, Known: true})
			return true
		}
	}
	return false
}

func (f *fakeProcs) adopt(ctx context.Context, id procID) (<-chan exitInfo, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	p := f.find(id)
	if p == nil || !p.alive {
		return nil, false
	}
	in, out := make(chan exitInfo, 1), make(chan exitInfo, 1)
	p.exits = in
	go func() {
		defer close(out)
		select {
		case e := <-in:
			out <- e
		case <-ctx.Done():
		}
	}()
	return out, true
}

func (f *fakeProcs) signal(id procID, sig syscall.Signal) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	p := f.find(id)
	if p == nil {
		return nil
	}
	p.signals = append(p.signals, sig)
	if sig == syscall.SIGTERM && p.exitOnTerm {
		f.exitLocked(p, exitInfo{Code: 143, Signal: 15, Known: true})
	}
	return nil
}

func (f *fakeProcs) killAll(id procID) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if p := f.find(id); p != nil {
		p.signals = append(p.signals, syscall.SIGKILL)
		f.exitLocked(p, exitInfo{Code: 137, Signal: 9, Known: true})
	}
}

func (f *fakeProcs) identify(pid int, _ string) (procID, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, p := range f.procs {
		if p.alive && p.id.PID == pid {
			return p.id, true
		}
	}
	return procID{}, false
}

func (f *fakeProcs) killNetns(path string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.netnsKills = append(f.netnsKills, path)
	if f.netnsStuck {
		return errors.New("fake: a process survives SIGKILL")
	}
	return nil
}

func (f *fakeProcs) setNetnsStuck(stuck bool) {
	f.mu.Lock()
	f.netnsStuck = stuck
	f.mu.Unlock()
}

func (f *fakeProcs) netnsKillCount() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.netnsKills)
}

func (f *fakeProcs) list() []fakeProc {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]fakeProc, 0, len(f.procs))
	for _, p := range f.procs {
		out = append(out, *p)
	}
	return out
}

func (f *fakeProcs) alive() int {
	n := 0
	for _, p := range f.list() {
		if p.alive {
			n++
		}
	}
	return n
}

type fakeProber struct {
	mu sync.Mutex
	ok map[string]bool // by container name
}

func (f *fakeProber) set(container string, ok bool) {
	f.mu.Lock()
	f.ok[container] = ok
	f.mu.Unlock()
}

func (f *fakeProber) probe(_ context.Context, _ *v1.Probe, t probeTarget) (bool, string) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.ok[t.Container.Name] {
		return true, ""
	}
	return false, "fake probe says no"
}
