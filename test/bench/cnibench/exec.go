package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/containernetworking/cni/pkg/invoke"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/version"
)

// benchExec is the invoke.Exec libcni runs plugins with. It times every
// plugin process, remembers which plugin ran last (so a failed
// AddNetworkList names the plugin and verb that failed), and in trace mode
// runs each plugin under strace.
type benchExec struct {
	*invoke.RawExec
	version.PluginDecoder

	mu       sync.Mutex
	counting bool                       // record plugin times (not during warm-up)
	pod      map[string][]time.Duration // this pod's times, kept if the pod succeeds
	times    map[string][]time.Duration // "plugin VERB" -> durations
	lastPlug string                     // plugin of the latest invocation
	lastVerb string                     // its CNI_COMMAND
	strace   string                     // strace binary; "" when not tracing
	traceDir string                     // where strace logs go
	traces   []*Trace                   // parsed traces
	traceErr []error                    // traces that could not be parsed
}

func newBenchExec() *benchExec {
	return &benchExec{RawExec: &invoke.RawExec{}, times: map[string][]time.Duration{}}
}

func envValue(environ []string, key string) string {
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok && k == key {
			return v
		}
	}
	return ""
}

// ExecPlugin implements invoke.Exec.
func (e *benchExec) ExecPlugin(ctx context.Context, pluginPath string, stdin []byte, environ []string) ([]byte, error) {
	plug, verb := filepath.Base(pluginPath), envValue(environ, "CNI_COMMAND")
	e.mu.Lock()
	e.lastPlug, e.lastVerb = plug, verb
	tracing, strace := e.strace != "" && verb != "VERSION", e.strace
	e.mu.Unlock()
	if tracing {
		return e.execTraced(ctx, strace, pluginPath, plug, verb, stdin, environ)
	}
	start := time.Now()
	out, err := e.RawExec.ExecPlugin(ctx, pluginPath, stdin, environ)
	d := time.Since(start)
	e.mu.Lock()
	if e.counting && err == nil {
		k := plug + " " + verb
		e.pod[k] = append(e.pod[k], d)
	}
	e.mu.Unlock()
	return out, err
}

// last returns the plugin and verb of the latest invocation.
func (e *benchExec) last() (string, string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.lastPlug, e.lastVerb
}

// beginPod starts collecting plugin times for one pod (if counted).
func (e *benchExec) beginPod(counted bool) {
	e.mu.Lock()
	e.counting, e.pod = counted, map[string][]time.Duration{}
	e.mu.Unlock()
}

// podPluginTime is the total time this pod's plugin processes took for
// verb (the time libcni spent outside them is the rest of the op).
func (e *benchExec) podPluginTime(verb string) time.Duration {
	e.mu.Lock()
	defer e.mu.Unlock()
	var sum time.Duration
	for k, v := range e.pod {
		if strings.HasSuffix(k, " "+verb) {
			for _, d := range v {
				sum += d
			}
		}
	}
	return sum
}

// endPod keeps the pod's plugin times when keep is set: failed pods and
// their cleanup DELs are not part of the figures.
func (e *benchExec) endPod(keep bool) {
	e.mu.Lock()
	if keep {
		for k, v := range e.pod {
			e.times[k] = append(e.times[k], v...)
		}
	}
	e.counting, e.pod = false, nil
	e.mu.Unlock()
}

func (e *benchExec) setTracing(strace, dir string) {
	e.mu.Lock()
	e.strace, e.traceDir = strace, dir
	e.mu.Unlock()
}

// execTraced runs the plugin under strace with the same stdin and
// environment and turns a failure into the plugin's CNI error, as RawExec
// does. strace exits with the plugin's status.
func (e *benchExec) execTraced(ctx context.Context, strace, pluginPath, plug, verb string, stdin []byte, environ []string) ([]byte, error) {
	f, err := os.CreateTemp(e.traceDir, "strace-"+plug+"-"+verb+"-*.log")
	if err != nil {
		return nil, err
	}
	f.Close()
	args := append(straceArgs(f.Name()), pluginPath)
	c := exec.CommandContext(ctx, strace, args...)
	var stdout, stderr bytes.Buffer
	c.Env, c.Stdin, c.Stdout, c.Stderr = environ, bytes.NewReader(stdin), &stdout, &stderr
	runErr := c.Run()
	if lf, err := os.Open(f.Name()); err == nil {
		progs, perr := ParseStrace(lf)
		lf.Close()
		e.mu.Lock()
		if perr != nil {
			e.traceErr = append(e.traceErr, fmt.Errorf("%s %s: %w", plug, verb, perr))
		} else {
			e.traces = append(e.traces, &Trace{Plugin: plug, Verb: verb, Programs: progs})
		}
		e.mu.Unlock()
	}
	if runErr != nil {
		emsg := &types.Error{}
		if stdout.Len() == 0 || json.Unmarshal(stdout.Bytes(), emsg) != nil {
			emsg = &types.Error{Code: 999, Msg: fmt.Sprintf("plugin failed under strace: %v: %q %q", runErr, stdout.String(), stderr.String())}
		}
		return nil, emsg
	}
	return stdout.Bytes(), nil
}
