package main

// What the harness reads from the machine: a process's CPU time and
// resident memory (/proc), the lab's processes by their pid files, the
// agent's Prometheus metrics (../promhist), and the routes the agent
// programmed (ip -n).

import (
	"fmt"
	"net/netip"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/flatnet/flatnet/internal/proc"
)

// clockTick is USER_HZ, 100 on every Linux this runs on.
const clockTick = 100

// usage is one process's CPU time (self, children not included: the
// daemons here start none worth counting) and memory.
type usage struct {
	PID    int     `json:"pid"`
	CPU    float64 `json:"cpuSeconds"`
	RSSMiB float64 `json:"rssMiB"`
	HWMMiB float64 `json:"peakRssMiB"`
	// Started is how long ago (at the reading) the process started.
	Started time.Duration `json:"-"`
}

// readUsage reads /proc/pid/stat and /proc/pid/status.
func readUsage(pid int) (usage, error) {
	u := usage{PID: pid}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return u, err
	}
	// The command is in parentheses and may hold spaces: fields after it.
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+2:])
	if len(f) < 20 {
		return u, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	ut, _ := strconv.ParseFloat(f[11], 64)
	st, _ := strconv.ParseFloat(f[12], 64)
	u.CPU = (ut + st) / clockTick
	start, _ := strconv.ParseFloat(f[19], 64)
	if up, err := uptime(); err == nil {
		u.Started = time.Duration((up - start/clockTick) * float64(time.Second))
	}
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return u, err
	}
	for _, line := range strings.Split(string(status), "\n") {
		k, v, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		kb, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
		switch k {
		case "VmRSS":
			u.RSSMiB = kb / 1024
		case "VmHWM":
			u.HWMMiB = kb / 1024
		}
	}
	return u, nil
}

func uptime() (float64, error) {
	b, err := os.ReadFile("/proc/uptime")
	if err != nil {
		return 0, err
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 0, fmt.Errorf("/proc/uptime: empty")
	}
	return strconv.ParseFloat(f[0], 64)
}

// labProcs reads the usage of every running process the lab recorded a
// pid file for (etcd, kube-apiserver, controller, agent-..., kwok).
func labProcs(stateDir string) map[string]usage {
	out := map[string]usage{}
	files, _ := filepath.Glob(filepath.Join(stateDir, "pids", "*.pid"))
	for _, f := range files {
		name := strings.TrimSuffix(filepath.Base(f), ".pid")
		pid, ok := proc.Running(stateDir, name)
		if !ok {
			continue
		}
		if u, err := readUsage(pid); err == nil {
			out[name] = u
		}
	}
	return out
}

// peerRoutes counts the IPv4 routes in the node namespace to pod subnets
// inside cluster other than own.
func peerRoutes(netnsName string, cluster, own netip.Prefix) (int, error) {
	dsts, err := peerRouteDsts(netnsName, cluster, own)
	return len(dsts), err
}

// peerRouteDsts lists the destinations of the routes peerRoutes counts.
func peerRouteDsts(netnsName string, cluster, own netip.Prefix) ([]string, error) {
	out, err := exec.Command("ip", "-n", netnsName, "-4", "route", "show").Output()
	if err != nil {
		return nil, fmt.Errorf("ip -n %s route: %w", netnsName, err)
	}
	var dsts []string
	for _, line := range strings.Split(string(out), "\n") {
		dst, _, _ := strings.Cut(line, " ")
		p, err := netip.ParsePrefix(dst)
		if err != nil || !isPeerRoute(cluster, own)(p) {
			continue
		}
		dsts = append(dsts, dst)
	}
	return dsts, nil
}

// isPeerRoute: a destination inside the cluster's range, no wider than it,
// that is not the node's own.
func isPeerRoute(cluster, own netip.Prefix) func(netip.Prefix) bool {
	return func(p netip.Prefix) bool {
		return cluster.Contains(p.Addr()) && p.Bits() >= cluster.Bits() && !p.Overlaps(own)
	}
}

// deletePeerRoutes deletes, in the lab node's namespace, the routes
// peerRoutes counts and the agent's nexthop objects (one ip -batch).
func deletePeerRoutes(netnsName string, cluster, own netip.Prefix) error {
	dsts, err := peerRouteDsts(netnsName, cluster, own)
	if err != nil || len(dsts) == 0 {
		return err
	}
	var batch strings.Builder
	for _, d := range dsts {
		fmt.Fprintf(&batch, "route del %s\n", d)
	}
	// And the agent's nexthop objects, as on a node that never ran it.
	batch.WriteString("nexthop flush proto 0x66\n")
	cmd := exec.Command("ip", "-n", netnsName, "-batch", "-")
	cmd.Stdin = strings.NewReader(batch.String())
	if out, err := cmd.CombinedOutput(); err != nil {
		return fmt.Errorf("deleting %d peer routes in %s: %w: %s", len(dsts), netnsName, err, out)
	}
	return nil
}
