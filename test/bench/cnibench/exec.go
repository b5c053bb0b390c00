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
	podCPU   map[string][]time.Duration // and CPU times
	cpu      map[string][]time.Duration // "plugin VERB" -> CPU time (user+sys, children included)
	times    map[string][]time.Duration // "plugin VERB" -> durations
	lastPlug string                     // plugin of the latest invocation
	lastVerb string                     // its CNI_COMMAND
	strace   string                     // strace binary; "" when not tracing
	traceDir string                     // where strace logs go
	traces   []*Trace                   // parsed traces
	traceErr []error                    // traces that could not be parsed
}

func newBenchExec() *benchExec {
	return &benchExec{RawExec: &invoke.RawExec{}, times: map[string][]time.Duration{}, cpu: map[string][]time.Duration{}}
}

func envValue(environ []string, key string) string {
	for _, kv := range environ {
		if k, v, ok := strings.Cut(kv, "="); ok && k == key {
			return v
		}
	}
	return ""
}

// ExecPlugin implements invoke.Exec like invoke.RawExec does, and also
// records the plugin's wall time and CPU time (user+system of the plugin
// and of every child it waited for, from wait4's rusage).
func (e *benchExec) ExecPlugin(ctx context.Context, pluginPath string, stdin []byte, environ []string) ([]byte, error) {
	plug, verb := filepath.Base(pluginPath), envValue(environ, "CNI_COMMAND")
	e.mu.Lock()
	e.lastPlug, e.lastVerb = plug, verb
	tracing, strace, traceDir := e.strace != "" && verb != "VERSION", e.strace, e.traceDir
	e.mu.Unlock()

	argv0, args, logPath := pluginPath, []string(nil), ""
	if tracing {
		f, err := os.CreateTemp(traceDir, "strace-"+plug+"-"+verb+"-*.log")
		if err != nil {
			return nil, err
		}
		f.Close()
		logPath = f.Name()
		argv0, args = strace, append(straceArgs(logPath), pluginPath)
	}
	var stdout, stderr bytes.Buffer
	c := exec.CommandContext(ctx, argv0, args...)
	c.Env, c.Stdin, c.Stdout, c.Stderr = environ, bytes.NewReader(stdin), &stdout, &stderr
	start := time.Now()
	runErr := c.Run()
	wall := time.Since(start)
	var cpu time.Duration
	if c.ProcessState != nil {
		cpu = c.ProcessState.UserTime() + c.ProcessState.SystemTime()
	}

	if tracing {
		e.parseTrace(plug, verb, logPath)
	} else {
		e.mu.Lock()
		if e.counting && runErr == nil {
			k := plug + " " + verb
			e.pod[k] = append(e.pod[k], wall)
			e.podCPU[k] = append(e.podCPU[k], cpu)
		}
		e.mu.Unlock()
	}
	if runErr != nil {
		return nil, pluginErr(runErr, stdout.Bytes(), stderr.Bytes())
	}
	return stdout.Bytes(), nil
}

// pluginErr turns a failed run into the plugin's CNI error, as RawExec
// does: the error JSON from stdout, else stderr, else the exit status.
func pluginErr(err error, stdout, stderr []byte) error {
	emsg := &types.Error{}
	switch {
	case len(stdout) == 0 && len(stderr) == 0:
		emsg.Msg = fmt.Sprintf("netplugin failed with no error message: %v", err)
	case len(stdout) == 0:
		emsg.Msg = fmt.Sprintf("netplugin failed: %q: %v", string(stderr), err)
	default:
		if perr := json.Unmarshal(stdout, emsg); perr != nil {
			emsg.Msg = fmt.Sprintf("netplugin failed but error parsing its diagnostic message %q: %v", string(stdout), perr)
		}
	}
	return emsg
}

func (e *benchExec) parseTrace(plug, verb, logPath string) {
	lf, err := os.Open(logPath)
	if err != nil {
		e.mu.Lock()
		e.traceErr = append(e.traceErr, fmt.Errorf("%s %s: %w", plug, verb, err))
		e.mu.Unlock()
		return
	}
	progs, perr := ParseStrace(lf)
	lf.Close()
	e.mu.Lock()
	defer e.mu.Unlock()
	if perr != nil {
		e.traceErr = append(e.traceErr, fmt.Errorf("%s %s: %w", plug, verb, perr))
		return
	}
	e.traces = append(e.traces, &Trace{Plugin: plug, Verb: verb, Programs: progs})
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
	e.counting, e.pod, e.podCPU = counted, map[string][]time.Duration{}, map[string][]time.Duration{}
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
		for k, v := range e.podCPU {
			e.cpu[k] = append(e.cpu[k], v...)
		}
	}
	e.counting, e.pod, e.podCPU = false, nil, nil
	e.mu.Unlock()
}

func (e *benchExec) setTracing(strace, dir string) {
	e.mu.Lock()
	e.strace, e.traceDir = strace, dir
	e.mu.Unlock()
}
