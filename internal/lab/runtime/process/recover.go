package process

// Recovery of a pod whose state file is unreadable (empty, truncated or
// missing after a crash or a power cut; atomicfile makes this rare, a full
// disk or a foreign edit can still do it).
//
// The record is the runtime's only memory of a pod's sandbox and
// processes, so an unreadable one must not be skipped: the pod's network
// namespace, its IP (held by IPAM under the CNI container ID) and its
// processes would leak, and the pod would get a second sandbox next to
// the first. Instead the record is rebuilt from what outlives it:
//
//   - namespace and name: the pod dir's name (<namespace>_<name>; neither
//     may hold '_');
//   - the sandbox: libcni's cache, which keeps every attachment's
//     container ID, netns path and K8S_POD_* args until DEL; else the
//     netns side file; else the netns named after the API pod's UID;
//   - the UID, host network and grace period: the API's Pod, else the
//     cache's K8S_POD_UID;
//   - container processes: the pid side files, each accepted only if
//     /proc confirms a container's first process (its own process group
//     and mount namespace, in the pod's network namespace).
//
// What the model supports from there is "a pod that is gone": the worker
// stops those processes, runs CNI DEL, removes the namespace and the dir.
// A pod the API still has then starts afresh, exactly as a new pod of the
// same name waits for the old one (worker.next). Its containers restart;
// nothing leaks and the pod is not lost.

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
)

// badRecord is a pod dir whose state file could not be read.
type badRecord struct {
	dir string
	err error
}

// podKey returns the namespace and name a pod dir is named after.
func podKey(dir string) (namespace, name string, ok bool) {
	namespace, name, ok = strings.Cut(filepath.Base(dir), "_")
	return namespace, name, ok && namespace != "" && name != "" && !strings.Contains(name, "_")
}

// recoverInput is what recoverRecord reads besides the pod dir.
type recoverInput struct {
	Dir    string
	Prefix string          // of the runtime's netns names
	Pod    *v1.Pod         // the API's Pod of that name on this node, or nil
	Cached []cniAttachment // libcni's attachments for the pod's namespace/name
	// Claimed are netns names and sandbox IDs of readable records: never
	// another pod's.
	Claimed map[string]bool
	NS      namespaces
	Procs   processes
	Now     time.Time
}

// recoverRecord rebuilds the record of the pod in in.Dir; notes says what
// was found, for the log.
func recoverRecord(in recoverInput) (rec *podRecord, notes []string, err error) {
	namespace, name, ok := podKey(in.Dir)
	if !ok {
		return nil, nil, fmt.Errorf("%s is not named <namespace>_<name>", in.Dir)
	}
	rec = &podRecord{Namespace: namespace, Name: name, StartTime: in.Now, GraceSeconds: int64(defaultGrace / time.Second)}
	if in.Pod != nil {
		rec.UID, rec.HostNetwork = in.Pod.UID, in.Pod.Spec.HostNetwork
		rec.GraceSeconds = int64(specGrace(in.Pod) / time.Second)
	}

	// The sandbox: the cached attachment of this pod (its UID's, when
	// known), not claimed by a readable record.
	for _, a := range in.Cached {
		uid := types.UID(argValue(a.Args, "K8S_POD_UID"))
		if in.Claimed[a.SandboxID] || (rec.UID != "" && uid != "" && uid != rec.UID) {
			continue
		}
		rec.SandboxID = a.SandboxID
		if rec.UID == "" {
			rec.UID = uid
		}
		notes = append(notes, "sandbox "+a.SandboxID+" from the CNI cache")
		if ns := filepath.Base(a.NetnsPath); a.NetnsPath != "" && strings.HasPrefix(ns, in.Prefix) {
			rec.Netns = ns
		}
		break
	}
	if rec.Netns == "" {
		if b, err := os.ReadFile(filepath.Join(in.Dir, "netns")); err == nil {
			p := strings.TrimSpace(string(b))
			if ns := filepath.Base(p); filepath.Dir(p) == netnsRunDir && strings.HasPrefix(ns, in.Prefix) {
				rec.Netns = ns
			}
		}
	}
	if rec.Netns == "" && rec.UID != "" {
		short, long := netnsNames(in.Prefix, rec.UID)
		for _, ns := range []string{long, short} {
			if in.NS.exists(ns) && !in.Claimed[ns] {
				rec.Netns = ns
				break
			}
		}
	}
	if rec.Netns != "" && (in.Claimed[rec.Netns] || !in.NS.exists(rec.Netns)) {
		rec.Netns = ""
	}
	if rec.Netns != "" {
		notes = append(notes, "netns "+rec.Netns)
	}

	// Container processes, by their pid files.
	ents, _ := os.ReadDir(filepath.Join(in.Dir, "containers"))
	for _, e := range ents {
		if !e.IsDir() {
			continue
		}
		cr := &containerRecord{Name: e.Name()}
		if in.Pod != nil {
			cr.Init = isInit(in.Pod, cr.Name)
		}
		rec.Containers = append(rec.Containers, cr)
		b, err := os.ReadFile(filepath.Join(in.Dir, "containers", e.Name(), "pid"))
		if err != nil {
			continue
		}
		pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
		if err != nil || pid <= 0 {
			notes = append(notes, fmt.Sprintf("container %s: unreadable pid file %q", cr.Name, b))
			continue
		}
		nsPath := ""
		if rec.Netns != "" {
			nsPath = filepath.Join(netnsRunDir, rec.Netns)
		}
		if p, ok := in.Procs.identify(pid, nsPath); ok {
			cr.Proc, cr.StartedAt = &p, in.Now
			notes = append(notes, fmt.Sprintf("container %s: pid %d", cr.Name, pid))
		}
	}
	return rec, notes, nil
}

func argValue(args [][2]string, key string) string {
	for _, kv := range args {
		if kv[0] == key {
			return kv[1]
		}
	}
	return ""
}

// recoverPod reports an unreadable record and starts a worker that tears
// down what recoverRecord found; the API's Pod, if any, waits for it.
func (c *core) recoverPod(ctx context.Context, b badRecord, claimed map[string]bool) {
	path := filepath.Join(b.dir, "state.json")
	namespace, name, ok := podKey(b.dir)
	if !ok {
		c.log.Error(b.err, "Unreadable pod state that names no pod (not in a <namespace>_<name> dir); leaving it alone", "path", path)
		return
	}
	pod, err := c.pods.Pods(namespace).Get(name)
	if err != nil || pod.Spec.NodeName != c.cfg.NodeName {
		pod = nil
	}
	cached, err := c.d.net.cached(namespace, name)
	if err != nil {
		c.log.Error(err, "Reading the CNI cache for a pod with an unreadable record", "path", path)
	}
	rec, notes, err := recoverRecord(recoverInput{
		Dir: b.dir, Prefix: c.cfg.NetnsPrefix, Pod: pod, Cached: cached, Claimed: claimed,
		NS: c.d.ns, Procs: c.d.procs, Now: c.d.now(),
	})
	if err != nil {
		c.log.Error(errors.Join(b.err, err), "Unreadable pod record; leaving it alone", "path", path)
		return
	}
	then := "what is left of the pod is cleaned up (the API has no such pod here)"
	if pod != nil {
		then = "the pod's sandbox is torn down and the pod started again"
	}
	c.log.Error(b.err, "Pod state file unreadable: rebuilt from the CNI cache, /proc and the API; "+then,
		"path", path, "pod", namespace+"/"+name, "found", notes)
	if pod != nil {
		c.recorder.Eventf(pod, v1.EventTypeWarning, "StateRecovered",
			"The runtime's state file %s was unreadable (%v): the pod's sandbox is torn down and made again", path, b.err)
	}
	c.startWorker(ctx, rec, nil, pod)
}
