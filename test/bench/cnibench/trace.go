package main

// Where the time goes: one pod per set is run with every plugin wrapped in
// `strace -f --seccomp-bpf`, tracing only process creation, netlink sends
// and /proc/sys opens (seccomp-bpf keeps the untraced syscalls at full
// speed). ParseStrace turns the log into per-program counts: programs
// started, rtnetlink and nfnetlink messages sent (one send is one round
// trip, an nft batch included), sysctl reads and writes, and each
// program's wall time under strace (inflated, but comparable between sets).

import (
	"bufio"
	"fmt"
	"io"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"
)

// straceArgs are the strace flags used for a traced plugin run; the plugin
// path follows "--".
func straceArgs(out string) []string {
	return []string{"-f", "--seccomp-bpf", "-ttt", "-yy", "-s", "96",
		"-e", "trace=execve,clone,clone3,vfork,fork,sendto,sendmsg,openat",
		"-e", "signal=none", "-o", out, "--"}
}

// ProgramStats aggregates the processes that ran one program.
type ProgramStats struct {
	Program      string   `json:"program"`
	Procs        int      `json:"procs"`
	WallMS       float64  `json:"wall_ms"`
	RtNetlink    int      `json:"rtnetlink_sends"`
	NfNetlink    int      `json:"nfnetlink_sends"`
	OtherNetlink int      `json:"other_netlink_sends"`
	SysctlWrites int      `json:"sysctl_writes"`
	SysctlReads  int      `json:"sysctl_reads"`
	Commands     []string `json:"commands,omitempty"`
	Sysctls      []string `json:"sysctls_written,omitempty"`
}

// Trace is one traced plugin invocation: the plugin itself first, then
// the programs it started.
type Trace struct {
	Plugin   string          `json:"plugin"`
	Verb     string          `json:"verb"`
	Programs []*ProgramStats `json:"programs"`
}

type proc struct {
	pid     int
	program string
	argv    string
	start   float64
	end     float64
	stats   ProgramStats
}

type event struct {
	tid  int
	ts   float64
	kind string // rt, nf, nl, sysctl-w, sysctl-r
	arg  string
}

var (
	lineRE   = regexp.MustCompile(`^(\d+)\s+(\d+\.\d+)\s+(.*)$`)
	resumeRE = regexp.MustCompile(`^<\.\.\. (\w+) resumed>(.*)$`)
	retRE    = regexp.MustCompile(`\)\s+=\s+(-?\d+)`)
	quotedRE = regexp.MustCompile(`"((?:[^"\\]|\\.)*)"`)
)

// ParseStrace reads an `strace -f -ttt -yy` log (flags from straceArgs).
// The first execve is the plugin; every later successful execve is a
// program it started. Threads are folded into their process by following
// clone(CLONE_THREAD); since strace may log a new thread's calls before
// its creator's clone returns, attribution happens after the whole log
// is read.
func ParseStrace(r io.Reader) ([]*ProgramStats, error) {
	pending := map[int]string{} // tid -> unfinished call text
	parent := map[int]int{}     // thread tid -> creating tid
	exits := map[int]float64{}  // tid -> exit time
	var procs []*proc           // in execve order
	var events []event
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		m := lineRE.FindStringSubmatch(sc.Text())
		if m == nil {
			continue
		}
		tid, _ := strconv.Atoi(m[1])
		ts, _ := strconv.ParseFloat(m[2], 64)
		text := m[3]
		if strings.HasSuffix(text, "<unfinished ...>") {
			pending[tid] = strings.TrimSuffix(text, "<unfinished ...>")
			continue
		}
		if rm := resumeRE.FindStringSubmatch(text); rm != nil {
			text = pending[tid] + rm[2]
			delete(pending, tid)
		}
		switch {
		case strings.HasPrefix(text, "+++ exited") || strings.HasPrefix(text, "+++ killed"):
			exits[tid] = ts
		case strings.HasPrefix(text, "execve("):
			if ret(text) != 0 {
				continue
			}
			q := quotedRE.FindAllStringSubmatch(text, -1)
			if len(q) == 0 {
				continue
			}
			var argv []string
			for _, a := range q[1:] {
				argv = append(argv, unquote(a[1]))
			}
			procs = append(procs, &proc{pid: tid, program: filepath.Base(unquote(q[0][1])), argv: strings.Join(argv, " "), start: ts})
		case strings.HasPrefix(text, "clone") || strings.HasPrefix(text, "vfork") || strings.HasPrefix(text, "fork"):
			if child := ret(text); child > 0 && strings.Contains(text, "CLONE_THREAD") {
				parent[child] = tid
			}
		case strings.HasPrefix(text, "sendto(") || strings.HasPrefix(text, "sendmsg("):
			fd, _, _ := strings.Cut(text, ",")
			switch {
			case strings.Contains(fd, "NETLINK:[ROUTE"):
				events = append(events, event{tid, ts, "rt", ""})
			case strings.Contains(fd, "NETLINK:[NETFILTER"):
				events = append(events, event{tid, ts, "nf", ""})
			case strings.Contains(fd, "NETLINK"):
				events = append(events, event{tid, ts, "nl", ""})
			}
		case strings.HasPrefix(text, "openat("):
			if ret(text) < 0 {
				continue
			}
			q := quotedRE.FindStringSubmatch(text)
			if q == nil || !strings.HasPrefix(q[1], "/proc/sys/") {
				continue
			}
			kind := "sysctl-r"
			if strings.Contains(text, "O_WRONLY") || strings.Contains(text, "O_RDWR") {
				kind = "sysctl-w"
			}
			events = append(events, event{tid, ts, kind, strings.TrimPrefix(q[1], "/proc/sys/")})
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading strace log: %w", err)
	}
	if len(procs) == 0 {
		return nil, fmt.Errorf("strace log has no successful execve: the plugin did not start")
	}
	leader := func(tid int) int {
		for i := 0; i < 64; i++ {
			p, ok := parent[tid]
			if !ok {
				break
			}
			tid = p
		}
		return tid
	}
	// A program runs in its process from its execve to the next execve in
	// that process or the process's exit.
	byPID := map[int][]*proc{}
	for _, p := range procs {
		if prev := byPID[p.pid]; len(prev) > 0 {
			prev[len(prev)-1].end = p.start
		}
		byPID[p.pid] = append(byPID[p.pid], p)
	}
	for pid, ps := range byPID {
		if last := ps[len(ps)-1]; last.end == 0 {
			last.end = exits[pid]
		}
	}
	for _, e := range events {
		var owner *proc
		for _, p := range byPID[leader(e.tid)] {
			if p.start <= e.ts {
				owner = p
			}
		}
		if owner == nil {
			continue // a forked child before its execve
		}
		s := &owner.stats
		switch e.kind {
		case "rt":
			s.RtNetlink++
		case "nf":
			s.NfNetlink++
		case "nl":
			s.OtherNetlink++
		case "sysctl-r":
			s.SysctlReads++
		case "sysctl-w":
			s.SysctlWrites++
			if !slices.Contains(s.Sysctls, e.arg) {
				s.Sysctls = append(s.Sysctls, e.arg)
			}
		}
	}
	// Aggregate by program, the plugin (first program) first.
	byName := map[string]*ProgramStats{}
	var out []*ProgramStats
	for i, p := range procs {
		s := byName[p.program]
		if s == nil {
			s = &ProgramStats{Program: p.program}
			byName[p.program] = s
			out = append(out, s)
		}
		s.Procs++
		if p.end > p.start {
			s.WallMS += (p.end - p.start) * 1000
		}
		s.RtNetlink += p.stats.RtNetlink
		s.NfNetlink += p.stats.NfNetlink
		s.OtherNetlink += p.stats.OtherNetlink
		s.SysctlWrites += p.stats.SysctlWrites
		s.SysctlReads += p.stats.SysctlReads
		for _, c := range p.stats.Sysctls {
			if !slices.Contains(s.Sysctls, c) {
				s.Sysctls = append(s.Sysctls, c)
			}
		}
		if i > 0 && len(s.Commands) < 64 {
			s.Commands = append(s.Commands, trunc(p.argv, 120))
		}
	}
	return out, nil
}

func ret(text string) int {
	m := retRE.FindAllStringSubmatch(text, -1)
	if m == nil {
		return -1
	}
	n, err := strconv.Atoi(m[len(m)-1][1])
	if err != nil {
		return -1
	}
	return n
}

func unquote(s string) string {
	if u, err := strconv.Unquote(`"` + s + `"`); err == nil {
		return u
	}
	return s
}

func trunc(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// durationMS converts for reports.
func durationMS(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
