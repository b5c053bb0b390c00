package process

// A pod's sandbox: its network namespace, the CNI attachment and the
// resolv.conf and hosts files the containers see. createSandbox records the
// namespace name and sandbox ID before creating anything, so that a crash in
// between leaves enough for teardown; a failed ADD is undone with DEL at once.

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	v1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"

	"github.com/flatnet/flatnet/internal/atomicfile"
)

// netnsNames are the names a pod's network namespace may have: the
// prefix and the first 8 hex digits of its UID, or, when another pod's
// UID starts the same, all of them.
func netnsNames(prefix string, uid types.UID) (short, long string) {
	u := strings.ReplaceAll(string(uid), "-", "")
	return prefix + u[:min(8, len(u))], prefix + u
}

func randomID(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

func (w *worker) netnsPath() string {
	if w.rec.Netns == "" {
		return ""
	}
	return filepath.Join(netnsRunDir, w.rec.Netns)
}

func (w *worker) resolvPath() string { return filepath.Join(w.dir, "etc", "resolv.conf") }
func (w *worker) hostsPath() string  { return filepath.Join(w.dir, "etc", "hosts") }

// writePodFiles writes the pod's resolv.conf and hosts.
func (w *worker) writePodFiles(pod *v1.Pod) error {
	if err := os.MkdirAll(filepath.Join(w.dir, "etc"), 0o755); err != nil {
		return err
	}
	nodeConf, err := os.ReadFile(w.c.d.resolvConf)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("reading the node's resolv.conf: %w", err)
	}
	dns, warns := podDNS(pod, dnsSettings{
		ClusterDNS: w.c.cfg.ClusterDNS, ClusterDomain: w.c.cfg.ClusterDomain, Node: parseResolvConf(nodeConf),
	})
	w.recordDNSWarnings(pod, warns)
	if err := atomicfile.WriteFile(w.resolvPath(), dns.file(), 0o644); err != nil {
		return err
	}
	hosts := hostsFile(pod, w.rec.IPs, w.c.cfg.ClusterDomain)
	if pod.Spec.HostNetwork {
		node, err := os.ReadFile(w.c.d.hostsFile)
		if err != nil && !errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("reading the node's hosts file: %w", err)
		}
		hosts = nodeHostsFile(pod, node)
	}
	return atomicfile.WriteFile(w.hostsPath(), hosts, 0o644)
}

// recordDNSWarnings reports them as the kubelet does: a warning event on
// the pod or the Node, and an error log.
func (w *worker) recordDNSWarnings(pod *v1.Pod, warns []dnsWarning) {
	for _, wn := range warns {
		// The kubelet logs these as errors, except MissingClusterDNS: an
		// event only, which every ClusterFirst pod gets without --cluster-dns.
		if wn.Reason != "MissingClusterDNS" {
			w.log.Error(nil, "Forming the pod's DNS config", "reason", wn.Reason, "message", wn.Message)
		}
		switch {
		case wn.LogOnly:
		case wn.OnNode:
			node := &v1.ObjectReference{Kind: "Node", Name: w.c.cfg.NodeName, UID: types.UID(w.c.cfg.NodeName)}
			w.c.recorder.Eventf(node, v1.EventTypeWarning, wn.Reason, "%s", wn.Message)
		default:
			w.event(pod, v1.EventTypeWarning, wn.Reason, "%s", wn.Message)
		}
	}
}

func (w *worker) createSandbox(ctx context.Context, pod *v1.Pod) {
	now := w.c.d.now()
	fail := func(err error) {
		w.sandboxErr = err.Error()
		w.sandboxBackoff = min(max(2*w.sandboxBackoff, time.Second), 16*time.Second)
		w.sandboxRetryAt = now.Add(w.sandboxBackoff)
		w.log.Error(err, "Creating the pod sandbox failed", "retryIn", w.sandboxBackoff)
		w.event(pod, v1.EventTypeWarning, "FailedCreatePodSandBox", "Failed to create pod sandbox: %v", err)
	}
	w.rec.GraceSeconds = int64(specGrace(pod) / time.Second)
	if pod.Spec.HostNetwork {
		w.rec.HostNetwork = true
		w.rec.IPs = []string{w.c.cfg.NodeIP}
		if err := w.writePodFiles(pod); err != nil {
			w.rec.IPs = nil
			fail(err)
			return
		}
		w.sandboxErr = ""
		return
	}
	if _, err := podAttachment(pod, "", ""); err != nil {
		fail(err)
		return
	}
	name, long := netnsNames(w.c.cfg.NetnsPrefix, pod.UID)
	if w.c.d.ns.exists(name) {
		name = long // another pod's UID starts the same
	}
	// Recorded before anything exists, so that a crash in between still
	// leaves enough to clean up.
	w.rec.Netns, w.rec.SandboxID = name, randomID(32)
	w.save()
	path, err := w.c.d.ns.create(name)
	if err != nil {
		w.rec.Netns, w.rec.SandboxID = "", ""
		fail(fmt.Errorf("creating network namespace %s: %w", name, err))
		return
	}
	att, _ := podAttachment(pod, w.rec.SandboxID, path)
	ips, err := w.c.d.net.add(ctx, att)
	if err == nil {
		w.rec.IPs = ips
		err = w.writePodFiles(pod)
	}
	if err != nil {
		// Undo: DEL releases what ADD may have reserved. If DEL fails
		// too, the record keeps the sandbox so the teardown is retried.
		if derr := w.c.d.net.del(ctx, att); derr != nil {
			w.log.Error(derr, "Undoing a failed CNI ADD failed; will retry")
		} else if rerr := w.c.d.ns.remove(name); rerr == nil {
			w.rec.Netns, w.rec.SandboxID = "", ""
		}
		w.rec.IPs = nil
		fail(err)
		return
	}
	w.sandboxErr, w.sandboxBackoff = "", 0
	w.log.Info("Pod sandbox ready", "netns", name, "ips", ips)
	w.warnUnsupported(pod)
}

// serviceAccountDir is where the ServiceAccount admission plugin mounts
// every pod's API token. The lab runtime mounts nothing (docs/lab.md says
// so); warning about the mount every pod has would drown the others.
const serviceAccountDir = "/var/run/secrets/kubernetes.io/serviceaccount"

// warnUnsupported says once per sandbox what of the spec the lab ignores,
// rather than let it pass silently.
func (w *worker) warnUnsupported(pod *v1.Pod) {
	var ignored []string
	for _, list := range [][]v1.Container{pod.Spec.InitContainers, pod.Spec.Containers} {
		for _, c := range list {
			if slices.ContainsFunc(c.VolumeMounts, func(m v1.VolumeMount) bool { return m.MountPath != serviceAccountDir }) {
				ignored = append(ignored, "volumeMounts of "+c.Name+" (containers see the host's files)")
			}
			if sc := c.SecurityContext; sc != nil && (sc.RunAsUser != nil || sc.RunAsGroup != nil) {
				ignored = append(ignored, "runAsUser/runAsGroup of "+c.Name+" (containers run as root)")
			}
		}
	}
	if len(ignored) > 0 {
		w.event(pod, v1.EventTypeWarning, "Unsupported", "The lab runtime ignores: %s", strings.Join(ignored, "; "))
	}
}

// teardown kills whatever is left in the pod's namespace, runs CNI DEL
// and removes the namespace. While a process in it survives SIGKILL the
// namespace stays (and the teardown is retried): removed, it would leave
// that process running in a namespace nothing names.
func (w *worker) teardown(ctx context.Context) error {
	path := w.netnsPath()
	if path != "" && w.c.d.ns.exists(w.rec.Netns) {
		if err := w.c.d.procs.killNetns(path); err != nil {
			return fmt.Errorf("emptying the pod's network namespace: %w", err)
		}
	}
	if w.rec.SandboxID != "" && !w.rec.HostNetwork {
		att := cniAttachment{
			SandboxID: w.rec.SandboxID,
			NetnsPath: path,
			IfName:    podIfName,
			Args: [][2]string{
				{"IgnoreUnknown", "1"},
				{"K8S_POD_NAMESPACE", w.rec.Namespace},
				{"K8S_POD_NAME", w.rec.Name},
				{"K8S_POD_INFRA_CONTAINER_ID", w.rec.SandboxID},
				{"K8S_POD_UID", string(w.rec.UID)},
			},
		}
		if path != "" && !w.c.d.ns.exists(w.rec.Netns) {
			att.NetnsPath = ""
		}
		if err := w.c.d.net.del(ctx, att); err != nil {
			return err
		}
	}
	if w.rec.Netns != "" {
		if err := w.c.d.ns.remove(w.rec.Netns); err != nil {
			return err
		}
	}
	w.log.Info("Pod sandbox removed", "netns", w.rec.Netns)
	w.rec.Netns, w.rec.SandboxID = "", ""
	return nil
}
