package process

import (
	"bytes"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/util/intstr"

	"github.com/flatnet/flatnet/internal/netns"
)

// Probes as the kubelet runs them (pkg/kubelet/prober): a startup probe
// gates the others; a readiness probe sets the container's Ready; a
// liveness probe that fails failureThreshold times in a row gets the
// container killed (and restarted per restartPolicy). Exec probes run in
// the container's namespaces through nsenter; tcpSocket and httpGet probes
// connect from the node's network namespace to the pod IP.

type probeKind string

const (
	readinessProbe probeKind = "Readiness"
	livenessProbe  probeKind = "Liveness"
	startupProbe   probeKind = "Startup"
)

// probeCounter turns a stream of results into a verdict, with the
// success and failure thresholds.
type probeCounter struct {
	successes, failures int32
	verdict             bool // current verdict
	decided             bool // a threshold was reached at least once
}

func thresholds(p *v1.Probe) (success, failure int32) {
	success, failure = p.SuccessThreshold, p.FailureThreshold
	if success < 1 {
		success = 1
	}
	if failure < 1 {
		failure = 3
	}
	return success, failure
}

// observe records one result and reports the verdict and whether it
// changed (including the first decision).
func (c *probeCounter) observe(ok bool, p *v1.Probe) (verdict, changed bool) {
	succ, fail := thresholds(p)
	if ok {
		c.failures = 0
		c.successes++
		if c.successes >= succ {
			changed = !c.decided || !c.verdict
			c.verdict, c.decided = true, true
		}
	} else {
		c.successes = 0
		c.failures++
		if c.failures >= fail {
			changed = !c.decided || c.verdict
			c.verdict, c.decided = false, true
		}
	}
	return c.verdict, changed
}

// probeTiming returns the initial delay, period and timeout with the API
// defaults.
func probeTiming(p *v1.Probe) (delay, period, timeout time.Duration) {
	delay = time.Duration(p.InitialDelaySeconds) * time.Second
	period = time.Duration(p.PeriodSeconds) * time.Second
	if period <= 0 {
		period = 10 * time.Second
	}
	timeout = time.Duration(p.TimeoutSeconds) * time.Second
	if timeout <= 0 {
		timeout = time.Second
	}
	return delay, period, timeout
}

// probeTarget is what a probe needs to reach a container.
type probeTarget struct {
	PodIP     string
	Container *v1.Container
	PID       int      // the container's first process, for exec probes
	Env       []string // the container's environment, for exec probes
}

// prober runs one probe once.
type prober interface {
	probe(ctx context.Context, p *v1.Probe, t probeTarget) (ok bool, msg string)
}

// realProber is the prober on the real system. hostNS, when set, is the
// network namespace to connect from (tests; the agent itself runs in its
// node's namespace).
type realProber struct {
	hostNS string
}

func (r realProber) probe(ctx context.Context, p *v1.Probe, t probeTarget) (bool, string) {
	_, _, timeout := probeTiming(p)
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	switch {
	case p.Exec != nil:
		return r.exec(ctx, p.Exec, t)
	case p.TCPSocket != nil:
		port, err := resolvePort(p.TCPSocket.Port, t.Container)
		if err != nil {
			return false, err.Error()
		}
		host := p.TCPSocket.Host
		if host == "" {
			host = t.PodIP
		}
		c, err := r.dial(ctx, net.JoinHostPort(host, strconv.Itoa(port)))
		if err != nil {
			return false, err.Error() // "dial tcp IP:port: ..." already
		}
		c.Close()
		return true, ""
	case p.HTTPGet != nil:
		return r.httpGet(ctx, p.HTTPGet, t)
	case p.GRPC != nil:
		return false, "grpc probes are not supported by the lab runtime"
	}
	return false, "probe has no handler"
}

func (r realProber) dial(ctx context.Context, addr string) (net.Conn, error) {
	var c net.Conn
	dial := func() error {
		var err error
		c, err = (&net.Dialer{}).DialContext(ctx, "tcp", addr)
		return err
	}
	var err error
	if r.hostNS != "" {
		err = netns.Do(r.hostNS, dial) // the socket stays in hostNS
	} else {
		err = dial()
	}
	return c, err
}

func (r realProber) exec(ctx context.Context, e *v1.ExecAction, t probeTarget) (bool, string) {
	if len(e.Command) == 0 {
		return false, "exec probe has no command"
	}
	if t.PID <= 0 {
		return false, "container is not running"
	}
	argv := append([]string{"-t", strconv.Itoa(t.PID), "-n", "-m", "-u", "--"}, e.Command...)
	cmd := exec.CommandContext(ctx, "nsenter", argv...)
	cmd.Env = t.Env
	var out bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &out
	// The command runs in its own process group (nsenter execs it, so
	// nsenter's PID leads the group): on timeout the whole group is
	// killed, not just its first process; after it ends, whatever it left
	// running too. WaitDelay bounds the wait for a pipe still held open
	// by a process that escaped the group (setsid).
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	cmd.Cancel = func() error { return killGroup(cmd.Process.Pid) }
	cmd.WaitDelay = execProbeWaitDelay
	err := cmd.Start()
	if err == nil {
		err = cmd.Wait()
		_ = killGroup(cmd.Process.Pid)
	}
	if ctx.Err() != nil {
		return false, fmt.Sprintf("command %q timed out", strings.Join(e.Command, " "))
	}
	// ErrWaitDelay: the command exited 0, a process it left kept the
	// output open (and was killed above). The exit status decides.
	if err != nil && !errors.Is(err, exec.ErrWaitDelay) {
		msg := strings.TrimSpace(out.String())
		var ee *exec.ExitError
		if errors.As(err, &ee) {
			return false, fmt.Sprintf("command %q exited with %d: %s", strings.Join(e.Command, " "), ee.ExitCode(), msg)
		}
		return false, fmt.Sprintf("running %q: %v", strings.Join(e.Command, " "), err)
	}
	return true, ""
}

// execProbeWaitDelay is how long an exec probe's output is read after its
// command ended or was killed.
const execProbeWaitDelay = 500 * time.Millisecond

// killGroup sends SIGKILL to the process group pgid; an empty group is not
// an error. Called after the leader was reaped, the number cannot name
// another group while any member of this one lives; once all are gone the
// kill finds nothing (a new process would have to get that very PID and
// make it a group within microseconds to be hit).
func killGroup(pgid int) error {
	if err := syscall.Kill(-pgid, syscall.SIGKILL); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("killing process group %d: %w", pgid, err)
	}
	return nil
}

func (r realProber) httpGet(ctx context.Context, h *v1.HTTPGetAction, t probeTarget) (bool, string) {
	port, err := resolvePort(h.Port, t.Container)
	if err != nil {
		return false, err.Error()
	}
	host := h.Host
	if host == "" {
		host = t.PodIP
	}
	scheme := strings.ToLower(string(h.Scheme))
	if scheme == "" {
		scheme = "http"
	}
	path := h.Path
	if !strings.HasPrefix(path, "/") {
		path = "/" + path
	}
	url := scheme + "://" + net.JoinHostPort(host, strconv.Itoa(port)) + path
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return false, err.Error()
	}
	req.Header.Set("User-Agent", "kube-probe/1.37")
	req.Header.Set("Accept", "*/*")
	for _, hh := range h.HTTPHeaders {
		if strings.EqualFold(hh.Name, "Host") {
			req.Host = hh.Value
			continue
		}
		req.Header.Add(hh.Name, hh.Value)
	}
	tr := &http.Transport{
		DisableKeepAlives: true,
		TLSClientConfig:   &tls.Config{InsecureSkipVerify: true}, // as the kubelet: probes do not verify
		DialContext: func(ctx context.Context, _, addr string) (net.Conn, error) {
			return r.dial(ctx, addr)
		},
	}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr, CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Do(req)
	if err != nil {
		return false, err.Error() // `Get "url": ...` already
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 10*1024))
	if resp.StatusCode >= 200 && resp.StatusCode < 400 {
		return true, ""
	}
	return false, fmt.Sprintf("HTTP probe failed with statuscode: %d %s", resp.StatusCode, strings.TrimSpace(string(body)))
}

// resolvePort turns a probe port (number or container port name) into a
// number.
func resolvePort(p intstr.IntOrString, c *v1.Container) (int, error) {
	if p.Type == intstr.Int {
		if p.IntVal < 1 || p.IntVal > 65535 {
			return 0, fmt.Errorf("probe port %d is out of range", p.IntVal)
		}
		return int(p.IntVal), nil
	}
	if n, err := strconv.Atoi(p.StrVal); err == nil && n > 0 && n < 65536 {
		return n, nil
	}
	if c != nil {
		for _, cp := range c.Ports {
			if cp.Name == p.StrVal {
				return int(cp.ContainerPort), nil
			}
		}
	}
	return 0, fmt.Errorf("probe port %q is not a number nor a named port of the container", p.StrVal)
}
