package main

import (
	"bytes"
	"fmt"
	"io"
	"os"
	"strings"
)

// Markers of the section of docs/benchmarks.md that -update-doc rewrites.
const (
	docBegin = "<!-- BEGIN FINAL RUN"
	docEnd   = "<!-- END FINAL RUN -->"
)

// writeMarkdown renders the figures of a run as the markdown of the docs'
// final-run section.
func writeMarkdown(w io.Writer, r *Results) {
	m := r.Machine
	cmd := "make bench-cni"
	if r.Pods != 30 || r.Warmup != 2 || r.HostRules != 0 {
		cmd = fmt.Sprintf("hack/bench-cni.sh -pods %d -warmup %d", r.Pods, r.Warmup)
		if r.HostRules != 0 {
			cmd += fmt.Sprintf(" -host-rules %d", r.HostRules)
		}
	}
	fmt.Fprintf(w, "Run of %s: `%s` (%d measured + %d warm-up pods per set, %s).\n", r.Time, cmd, r.Pods, r.Warmup, r.Order)
	fmt.Fprintf(w, "Machine: %s CPUs (%s), kernel %s, %s; load average %s at start, %s at end.\n\n", m["cpus"], m["cpu"], m["kernel"], m["go"], m["load_start"], m["load_end"])
	fmt.Fprintln(w, "| set | op | n | median ms | p90 ms | p99 ms | mean ms |")
	fmt.Fprintln(w, "|---|---|---:|---:|---:|---:|---:|")
	for _, s := range r.Sets {
		label := s.Name
		if s.Version != "" {
			label += " (" + s.Version + ")"
		}
		for _, op := range []struct {
			name string
			v    Summary
		}{{"ADD", s.Add}, {"DEL", s.Del}, {"ADD+DEL", s.Total}} {
			if op.v.N == 0 {
				fmt.Fprintf(w, "| %s | %s | 0 | - | - | - | - |\n", label, op.name)
				continue
			}
			fmt.Fprintf(w, "| %s | %s | %d | %.1f | %.1f | %.1f | %.1f |\n", label, op.name, op.v.N, op.v.Median, op.v.P90, op.v.P99, op.v.Mean)
		}
	}
	for _, set := range ratioSets {
		if _, ok := r.Ratio[ratioPrefix(set)+"add"]; !ok {
			continue
		}
		fmt.Fprintf(w, "\n**Ratio %s/ref (medians):**", set)
		for _, k := range []string{"add", "del", "add_plus_del"} {
			name := strings.ToUpper(strings.ReplaceAll(k, "_plus_", "+"))
			if v := r.Ratio[ratioPrefix(set)+k]; v != nil {
				fmt.Fprintf(w, " %s %.3f (%.1f× faster);", name, *v, 1 / *v)
			} else {
				fmt.Fprintf(w, " %s n/a;", name)
			}
		}
		fmt.Fprintln(w)
	}
	fmt.Fprintln(w, "\nPer plugin process, median ms: wall (CPU user+sys, children included); libcni = op time outside the plugin processes. host-local is inside bridge in both sets: the reference bridge execs it, ours runs it in-process.")
	fmt.Fprintln(w)
	fmt.Fprintln(w, "| set | verb | bridge (+host-local) | bandwidth | portmap | flatnet (all four) | libcni |")
	fmt.Fprintln(w, "|---|---|---:|---:|---:|---:|---:|")
	for _, s := range r.Sets {
		for _, verb := range []string{"ADD", "DEL"} {
			row := []string{s.Name, verb}
			for _, p := range []string{"bridge", "bandwidth", "portmap", "flatnet"} {
				if v, ok := s.Plugins[p+" "+verb]; ok && v.N > 0 {
					row = append(row, fmt.Sprintf("%.1f (%.1f)", v.Median, s.PluginCPU[p+" "+verb].Median))
				} else {
					row = append(row, "-")
				}
			}
			rest := s.AddRest
			if verb == "DEL" {
				rest = s.DelRest
			}
			row = append(row, fmt.Sprintf("%.1f", rest.Median))
			fmt.Fprintf(w, "| %s |\n", strings.Join(row, " | "))
		}
	}
	if len(r.Sets) > 0 && len(r.Sets[0].Traces) > 0 {
		fmt.Fprintln(w, "\nOne pod per set under strace (counts exact; wall inflated by tracing):")
		fmt.Fprintln(w)
		fmt.Fprintln(w, "| set | verb | plugin | processes | programs started | rtnetlink sends | nfnetlink sends | sysctl writes/reads |")
		fmt.Fprintln(w, "|---|---|---|---:|---|---:|---:|---:|")
		for _, s := range r.Sets {
			for _, t := range s.Traces {
				procs, rt, nf, sw, sr := 0, 0, 0, 0, 0
				var kids []string
				for i, p := range t.Programs {
					procs += p.Procs
					rt += p.RtNetlink
					nf += p.NfNetlink
					sw += p.SysctlWrites
					sr += p.SysctlReads
					if i > 0 {
						kids = append(kids, fmt.Sprintf("%s×%d", p.Program, p.Procs))
					}
				}
				if len(kids) == 0 {
					kids = []string{"-"}
				}
				fmt.Fprintf(w, "| %s | %s | %s | %d | %s | %d | %d | %d/%d |\n", s.Name, t.Verb, t.Plugin, procs, strings.Join(kids, ", "), rt, nf, sw, sr)
			}
		}
	}
	if len(r.Floors) > 0 {
		fmt.Fprintf(w, "\nBuilding blocks in the bench host netns (%d runs each):\n\n", floorRuns)
		fmt.Fprintln(w, "| what | median ms | p90 ms |")
		fmt.Fprintln(w, "|---|---:|---:|")
		for _, f := range r.Floors {
			if f.Err != "" {
				fmt.Fprintf(w, "| %s | error: %s | |\n", f.What, f.Err)
				continue
			}
			fmt.Fprintf(w, "| %s | %.2f | %.2f |\n", f.What, f.Median, f.P90)
		}
	}
	var fails []string
	for _, s := range r.Sets {
		if len(s.Failures) > 0 {
			fails = append(fails, fmt.Sprintf("%s: %d of %d pods failed (first: %s %s: %s)", s.Name, s.Pods-s.OKPods, s.Pods, s.Failures[0].Verb, s.Failures[0].Plugin, s.Failures[0].Msg))
		}
	}
	if len(fails) > 0 {
		fmt.Fprintf(w, "\nFailures: %s\n", strings.Join(fails, "; "))
	}
	for _, n := range r.Notes {
		fmt.Fprintf(w, "\nNote: %s\n", n)
	}
}

// updateDoc replaces the final-run section of the markdown file at path.
func updateDoc(path string, r *Results) error {
	data, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	s := string(data)
	i := strings.Index(s, docBegin)
	j := strings.Index(s, docEnd)
	if i < 0 || j < i {
		return fmt.Errorf("%s: no %q ... %q section to update", path, docBegin, docEnd)
	}
	// Keep the begin marker's line and the heading after it.
	head := s[:i]
	rest := s[i:j]
	nl := strings.Index(rest, "\n")
	begin := rest[:nl+1]
	var b bytes.Buffer
	b.WriteString(head)
	b.WriteString(begin)
	b.WriteString("### Figures\n\n")
	writeMarkdown(&b, r)
	b.WriteString("\n")
	b.WriteString(s[j:])
	return os.WriteFile(path, b.Bytes(), 0o644)
}
