package process

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/flatnet/flatnet/internal/atomicfile"

	"k8s.io/apimachinery/pkg/types"
)

// On-disk layout under the runtime state dir (a contract with `lab exec`
// and people reading it):
//
//	pods/<namespace>_<name>/state.json           the record below (the runtime's truth)
//	pods/<namespace>_<name>/netns                path of the pod's network namespace
//	pods/<namespace>_<name>/etc/{resolv.conf,hosts}   bind-mounted into the containers
//	pods/<namespace>_<name>/containers/<c>/pid   PID while the container runs
//	pods/<namespace>_<name>/containers/<c>/log   its stdout and stderr, all runs appended
//
// state.json, netns, pid and log are 0600; resolv.conf and hosts are 0644
// (what the containers read as /etc files).

// stateFileMode is the mode of the pod's state files and container logs:
// what a pod logs or how it is run is for root only.
const stateFileMode = 0o600

func podDir(stateDir, namespace, name string) string {
	return filepath.Join(stateDir, "pods", namespace+"_"+name)
}

func containerDir(podDir, container string) string {
	return filepath.Join(podDir, "containers", container)
}

// podRecord is what survives an agent restart: enough to adopt running
// containers, or to clean up after a pod that went away meanwhile.
type podRecord struct {
	UID         types.UID `json:"uid"`
	Namespace   string    `json:"namespace"`
	Name        string    `json:"name"`
	HostNetwork bool      `json:"hostNetwork,omitempty"`
	// Netns is the pod network namespace's name under /run/netns; ""
	// when there is none (not yet created, torn down, host network).
	Netns string `json:"netns,omitempty"`
	// SandboxID is the CNI container ID; Attached says CNI ADD succeeded
	// and DEL is owed.
	SandboxID string    `json:"sandboxID,omitempty"`
	Attached  bool      `json:"attached,omitempty"`
	IPs       []string  `json:"ips,omitempty"`
	StartTime time.Time `json:"startTime"`
	// Grace is the last termination grace period seen, for deletions of
	// pods that are gone from the API.
	GraceSeconds int64              `json:"graceSeconds"`
	Containers   []*containerRecord `json:"containers"`
}

// containerRecord is one container's history.
type containerRecord struct {
	Name         string      `json:"name"`
	Init         bool        `json:"init,omitempty"` // an init container (or sidecar)
	ID           string      `json:"id,omitempty"`   // of the current or last run
	Proc         *procID     `json:"proc,omitempty"`
	StartedAt    time.Time   `json:"startedAt,omitzero"`
	LastExit     *exitRecord `json:"lastExit,omitempty"`
	RestartCount int32       `json:"restartCount"`
	// Backoff before the next restart after a crash (CrashLoopBackOff);
	// NextStart is when that restart may happen.
	Backoff   time.Duration `json:"backoff,omitempty"`
	NextStart time.Time     `json:"nextStart,omitzero"`

	// Not persisted: runtime-only state, rebuilt after a restart.
	StartErr       string        `json:"-"` // why the last start failed before a process existed
	StartErrReason string        `json:"-"` // CreateContainerConfigError, ...
	TermSentAt     time.Time     `json:"-"` // SIGTERM sent, SIGKILL due after TermGrace
	TermGrace      time.Duration `json:"-"`
	KillSentAt     time.Time     `json:"-"` // SIGKILL sent; waiting for the exit
	KillReason     string        `json:"-"` // why the runtime stops it while the pod stays (failed probe)
	KillGrace      time.Duration `json:"-"`
	Ready          bool          `json:"-"` // readiness probe verdict
	Started        bool          `json:"-"` // startup probe passed (or none)
}

// running reports whether the container has a live process.
func (c *containerRecord) running() bool { return c.Proc != nil }

// procID identifies a process beyond its PID: the start time in clock
// ticks since boot (a recycled PID has another) and the inode of the mount
// namespace created for the container, which every process of the
// container shares (our stand-in for a cgroup).
type procID struct {
	PID        int    `json:"pid"`
	StartTicks uint64 `json:"startTicks"`
	MntNS      uint64 `json:"mntNS"`
}

// exitRecord is a finished run.
type exitRecord struct {
	Code       int32     `json:"code"`
	Signal     int32     `json:"signal,omitempty"`
	Reason     string    `json:"reason"`
	Message    string    `json:"message,omitempty"`
	StartedAt  time.Time `json:"startedAt,omitzero"`
	FinishedAt time.Time `json:"finishedAt"`
}

func (r *podRecord) container(name string) *containerRecord {
	for _, c := range r.Containers {
		if c.Name == name {
			return c
		}
	}
	return nil
}

// sideFiles are the human-readable files next to state.json, by path:
// the netns file and the pid files, nil for one that must not exist.
func (r *podRecord) sideFiles(dir string) map[string][]byte {
	files := map[string][]byte{filepath.Join(dir, "netns"): nil}
	if r.Netns != "" {
		files[filepath.Join(dir, "netns")] = []byte(filepath.Join(netnsRunDir, r.Netns) + "\n")
	}
	for _, c := range r.Containers {
		var b []byte
		if c.Proc != nil {
			b = []byte(strconv.Itoa(c.Proc.PID) + "\n")
		}
		files[filepath.Join(containerDir(dir, c.Name), "pid")] = b
	}
	return files
}

// save writes the record and the human-readable side files atomically.
func (r *podRecord) save(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("creating pod state dir: %w", err)
	}
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	if err := writeChanged(filepath.Join(dir, "state.json"), b); err != nil {
		return err
	}
	for path, b := range r.sideFiles(dir) {
		if b == nil {
			if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
				return err
			}
			continue
		}
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return err
		}
		if err := writeChanged(path, b); err != nil {
			return err
		}
	}
	return nil
}

// writeChanged replaces path with b (durably, mode stateFileMode) unless
// it holds b already: the worker saves after every step, most of which
// change nothing.
func writeChanged(path string, b []byte) error {
	if got, err := os.ReadFile(path); err == nil && bytes.Equal(got, b) {
		return nil
	}
	return atomicfile.WriteFile(path, b, stateFileMode)
}

// staleSideFiles returns the side files that do not say what the record
// says (a truncated pid file, say); the next save rewrites them.
func staleSideFiles(dir string, r *podRecord) []string {
	var stale []string
	for path, want := range r.sideFiles(dir) {
		got, err := os.ReadFile(path)
		if (want == nil && !errors.Is(err, os.ErrNotExist)) || (want != nil && !bytes.Equal(got, want)) {
			stale = append(stale, path)
		}
	}
	slices.Sort(stale)
	return stale
}

func loadRecord(dir string) (*podRecord, error) {
	b, err := os.ReadFile(filepath.Join(dir, "state.json"))
	if err != nil {
		return nil, err
	}
	var r podRecord
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("decoding %s/state.json: %w", dir, err)
	}
	if r.Namespace == "" || r.Name == "" || r.UID == "" {
		return nil, fmt.Errorf("%s/state.json: no pod namespace, name or uid", dir)
	}
	return &r, nil
}

// loadRecords reads every pod record in stateDir. A pod dir without a
// readable record is returned in bad, for the caller to recover.
func loadRecords(stateDir string) (recs []*podRecord, bad []badRecord) {
	dir := filepath.Join(stateDir, "pods")
	ents, err := os.ReadDir(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, nil
		}
		return nil, []badRecord{{dir, err}}
	}
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		r, err := loadRecord(filepath.Join(dir, e.Name()))
		if err != nil {
			bad = append(bad, badRecord{filepath.Join(dir, e.Name()), err})
			continue
		}
		recs = append(recs, r)
	}
	return recs, bad
}

// ErrNotRunning is returned (wrapped) by ContainerPID when the container
// has no live process.
var ErrNotRunning = errors.New("container is not running")

// ContainerPID returns the PID of a running container of a pod run by the
// runtime whose state dir is stateDir (`lab exec` enters it with nsenter).
// An empty container names the pod's first (non-init) container.
func ContainerPID(stateDir, namespace, pod, container string) (int, error) {
	dir := podDir(stateDir, namespace, pod)
	r, err := loadRecord(dir)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return 0, fmt.Errorf("pod %s/%s is not run by the runtime in %s", namespace, pod, stateDir)
		}
		return 0, err
	}
	var c *containerRecord
	if container == "" {
		for _, rc := range r.Containers {
			if !rc.Init {
				c = rc
				break
			}
		}
		if c == nil {
			return 0, fmt.Errorf("pod %s/%s has no containers", namespace, pod)
		}
	} else if c = r.container(container); c == nil {
		names := make([]string, 0, len(r.Containers))
		for _, c := range r.Containers {
			names = append(names, c.Name)
		}
		return 0, fmt.Errorf("pod %s/%s has no container %q (it has: %s)", namespace, pod, container, strings.Join(names, ", "))
	}
	if c.Proc == nil || !procAlive(*c.Proc) {
		return 0, fmt.Errorf("%w: %s in pod %s/%s", ErrNotRunning, c.Name, namespace, pod)
	}
	return c.Proc.PID, nil
}
