package main

import (
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"math"
	"net"
	"net/netip"
	"os"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// Results is everything a run reports (and what -json writes).
type Results struct {
	Time      string              `json:"time"`
	Machine   map[string]string   `json:"machine"`
	Chain     string              `json:"chain"`
	Subnet    string              `json:"subnet"`
	Pods      int                 `json:"pods_per_set"`
	Warmup    int                 `json:"warmup_per_set"`
	HostRules int                 `json:"host_rules,omitempty"`
	Order     string              `json:"order"`
	Conflist  json.RawMessage     `json:"conflist"`
	Sets      []SetResult         `json:"sets"`
	Ratio     map[string]*float64 `json:"ratio_ours_over_ref_median,omitempty"`
	Floors    []Floor             `json:"floors,omitempty"`
	Notes     []string            `json:"notes,omitempty"`
}

// Window is ADD+DEL over the measured pods First..Last (1-based).
type Window struct {
	First int     `json:"first_pod"`
	Last  int     `json:"last_pod"`
	Total Summary `json:"add_plus_del"`
}

// windows cuts the per-pod times (in pod order) into n windows.
func windows(ds []time.Duration, n int) []Window {
	if len(ds) < 2*n {
		return nil
	}
	var out []Window
	for i := range n {
		lo, hi := i*len(ds)/n, (i+1)*len(ds)/n
		out = append(out, Window{First: lo + 1, Last: hi, Total: Summarize(ds[lo:hi])})
	}
	return out
}

// SetResult is one plugin set's figures.
type SetResult struct {
	Name      string             `json:"name"`
	Version   string             `json:"version,omitempty"`
	Path      string             `json:"cni_path"`
	Pods      int                `json:"pods_run"`
	OKPods    int                `json:"pods_ok"`
	Add       Summary            `json:"add"`
	Del       Summary            `json:"del"`
	Total     Summary            `json:"add_plus_del"`
	Plugins   map[string]Summary `json:"plugin_exec,omitempty"` // "plugin VERB"
	PluginCPU map[string]Summary `json:"plugin_cpu,omitempty"`  // user+sys incl. children
	// Windows is ADD+DEL over the measured pods in five consecutive
	// windows (pods 1-100, 101-200, ... of 500): flat means no window's
	// median grows with the pods made before it.
	Windows  []Window  `json:"add_plus_del_by_window,omitempty"`
	AddRest  Summary   `json:"add_outside_plugins"`
	DelRest  Summary   `json:"del_outside_plugins"`
	Traces   []*Trace  `json:"traces,omitempty"`
	Failures []Failure `json:"failures,omitempty"`
}

func (b *bench) results() *Results {
	r := &Results{
		Time:      time.Now().UTC().Format(time.RFC3339),
		Machine:   machine(),
		Chain:     "bridge(host-local, isGateway, ipMasq) -> bandwidth(ingress+egress via capability) -> portmap(2 portMappings via capability); the flatnet set: the same as one plugin of the flatnet type",
		Subnet:    b.subnet.String(),
		Pods:      b.o.pods,
		Warmup:    b.o.warmup,
		HostRules: b.o.hostRules,
		Order:     "alternating pod by pod: " + strings.Join(b.setNames(), ", ") + ", ...",
		Notes:     b.notes,
		Floors:    b.floorResults,
	}
	r.Machine["load_start"], r.Machine["load_end"] = b.load0, loadavg()
	if len(b.sets) > 0 {
		r.Conflist = b.sets[0].conf
	}
	for _, s := range b.sets {
		sr := SetResult{Name: s.name, Version: s.version, Path: s.binDir, Pods: s.pods, OKPods: s.okPods,
			Add: Summarize(s.add), Del: Summarize(s.del), Total: Summarize(s.total),
			Plugins: map[string]Summary{}, PluginCPU: map[string]Summary{}, Failures: s.failures,
			AddRest: Summarize(s.addRest), DelRest: Summarize(s.delRest), Windows: windows(s.total, 5)}
		s.exec.mu.Lock()
		for k, v := range s.exec.times {
			sr.Plugins[k] = Summarize(v)
		}
		for k, v := range s.exec.cpu {
			sr.PluginCPU[k] = Summarize(v)
		}
		sr.Traces = s.exec.traces
		for _, e := range s.exec.traceErr {
			r.Notes = append(r.Notes, fmt.Sprintf("%s trace: %v", s.name, e))
		}
		s.exec.mu.Unlock()
		r.Sets = append(r.Sets, sr)
	}
	// Ratios to the reference: "add" etc. for ours (the classic
	// conflist), "flatnet_add" etc. for the flatnet type.
	if ref := r.set("ref"); ref != nil {
		for _, name := range []string{"ours", "flatnet"} {
			s := r.set(name)
			if s == nil {
				continue
			}
			if r.Ratio == nil {
				r.Ratio = map[string]*float64{}
			}
			p := ratioPrefix(name)
			r.Ratio[p+"add"] = finite(Ratio(s.Add.Median, ref.Add.Median), s.Add.N, ref.Add.N)
			r.Ratio[p+"del"] = finite(Ratio(s.Del.Median, ref.Del.Median), s.Del.N, ref.Del.N)
			r.Ratio[p+"add_plus_del"] = finite(Ratio(s.Total.Median, ref.Total.Median), s.Total.N, ref.Total.N)
		}
	}
	return r
}

// ratioPrefix is the prefix of a set's keys in Results.Ratio.
func ratioPrefix(set string) string {
	if set == "ours" {
		return ""
	}
	return set + "_"
}

// ratioSets are the sets compared with the reference, in report order.
var ratioSets = []string{"ours", "flatnet"}

func finite(v float64, n ...int) *float64 {
	for _, x := range n {
		if x == 0 {
			return nil
		}
	}
	if math.IsNaN(v) || math.IsInf(v, 0) {
		return nil
	}
	return &v
}

func (b *bench) setNames() []string {
	var n []string
	for _, s := range b.sets {
		n = append(n, s.name)
	}
	return n
}

func (r *Results) set(name string) *SetResult {
	for i := range r.Sets {
		if r.Sets[i].Name == name {
			return &r.Sets[i]
		}
	}
	return nil
}

func writeJSON(path string, r *Results) error {
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return fmt.Errorf("encoding results: %w", err)
	}
	data = append(data, '\n')
	if path == "-" {
		_, err = os.Stdout.Write(data)
		return err
	}
	if err := os.WriteFile(path, data, 0o644); err != nil {
		return fmt.Errorf("writing %s: %w", path, err)
	}
	return nil
}

func ms(v float64) string { return fmt.Sprintf("%.1f", v) }

func printReport(w io.Writer, r *Results, verbose bool) {
	fmt.Fprintf(w, "cnibench: %s\n", r.Chain)
	fmt.Fprintf(w, "machine: %s cpus, %s, kernel %s, %s; load average %s at start, %s at end\n", r.Machine["cpus"], r.Machine["cpu"], r.Machine["kernel"], r.Machine["go"], r.Machine["load_start"], r.Machine["load_end"])
	fmt.Fprintf(w, "pods: %d measured + %d warm-up per set, %s; subnet %s; times in ms (libcni AddNetworkList / DelNetworkList)\n\n",
		r.Pods, r.Warmup, r.Order, r.Subnet)

	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "set\top\tn\tmedian\tp90\tp99\tmean\tmin\tmax\t")
	for _, s := range r.Sets {
		for _, op := range []struct {
			name string
			v    Summary
		}{{"ADD", s.Add}, {"DEL", s.Del}, {"ADD+DEL", s.Total}} {
			if op.v.N == 0 {
				fmt.Fprintf(tw, "%s\t%s\t0\t-\t-\t-\t-\t-\t-\t\n", s.Name, op.name)
				continue
			}
			fmt.Fprintf(tw, "%s\t%s\t%d\t%s\t%s\t%s\t%s\t%s\t%s\t\n", s.Name, op.name, op.v.N,
				ms(op.v.Median), ms(op.v.P90), ms(op.v.P99), ms(op.v.Mean), ms(op.v.Min), ms(op.v.Max))
		}
	}
	tw.Flush()
	if len(r.Sets) > 0 && len(r.Sets[0].Windows) > 0 {
		fmt.Fprintf(w, "\nADD+DEL by window of measured pods, median / p90 ms (flat: no growth with the pods made before):\n")
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
		fmt.Fprint(tw, "set\t")
		for _, win := range r.Sets[0].Windows {
			fmt.Fprintf(tw, "pods %d-%d\t", win.First, win.Last)
		}
		fmt.Fprintln(tw, "last/first median\t")
		for _, s := range r.Sets {
			if len(s.Windows) == 0 {
				continue
			}
			fmt.Fprintf(tw, "%s\t", s.Name)
			for _, win := range s.Windows {
				fmt.Fprintf(tw, "%s / %s\t", ms(win.Total.Median), ms(win.Total.P90))
			}
			fmt.Fprintf(tw, "%.2f\t\n", Ratio(s.Windows[len(s.Windows)-1].Total.Median, s.Windows[0].Total.Median))
		}
		tw.Flush()
	}
	for _, set := range ratioSets {
		if _, ok := r.Ratio[ratioPrefix(set)+"add"]; !ok {
			continue
		}
		fmt.Fprintf(w, "\nratio %s/ref (median):", set)
		for _, k := range []string{"add", "del", "add_plus_del"} {
			if v := r.Ratio[ratioPrefix(set)+k]; v != nil {
				speed := fmt.Sprintf("%.1fx faster", 1 / *v)
				if *v > 1 {
					speed = fmt.Sprintf("%.1fx slower", *v)
				}
				fmt.Fprintf(w, "  %s %.3f (%s)", strings.ToUpper(strings.ReplaceAll(k, "_plus_", "+")), *v, speed)
			} else {
				fmt.Fprintf(w, "  %s n/a", strings.ToUpper(strings.ReplaceAll(k, "_plus_", "+")))
			}
		}
		fmt.Fprintln(w)
	}

	// Per-plugin process times from the timed pods.
	fmt.Fprintln(w, "\nper plugin process, median ms over the measured pods: wall (CPU user+sys incl. its children); libcni = op time outside plugin processes:")
	tw = tabwriter.NewWriter(w, 0, 0, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "set\tverb\tbridge (+host-local)\tbandwidth\tportmap\tflatnet (all four)\tlibcni\t")
	for _, s := range r.Sets {
		for _, verb := range []string{"ADD", "DEL"} {
			row := []string{s.Name, verb}
			for _, p := range []string{"bridge", "bandwidth", "portmap", "flatnet"} {
				if v, ok := s.Plugins[p+" "+verb]; ok && v.N > 0 {
					row = append(row, fmt.Sprintf("%s (%s)", ms(v.Median), ms(s.PluginCPU[p+" "+verb].Median)))
				} else {
					row = append(row, "-")
				}
			}
			rest := s.AddRest
			if verb == "DEL" {
				rest = s.DelRest
			}
			if rest.N > 0 {
				row = append(row, ms(rest.Median))
			} else {
				row = append(row, "-")
			}
			fmt.Fprintln(tw, strings.Join(row, "\t")+"\t")
		}
	}
	tw.Flush()

	printTraces(w, r, verbose)

	if len(r.Floors) > 0 {
		fmt.Fprintf(w, "\nbuilding blocks on this machine (bench host netns, %d runs each, ms):\n", floorRuns)
		tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
		fmt.Fprintln(tw, "what\tmedian\tp90\t")
		for _, f := range r.Floors {
			if f.Err != "" {
				fmt.Fprintf(tw, "%s\t-\t-\terror: %s\n", f.What, f.Err)
				continue
			}
			fmt.Fprintf(tw, "%s\t%.2f\t%.2f\t\n", f.What, f.Median, f.P90)
		}
		tw.Flush()
	}

	for _, s := range r.Sets {
		if len(s.Failures) == 0 {
			continue
		}
		fmt.Fprintf(w, "\n%s: %d of %d pods failed; failures grouped (count × pod of first):\n", s.Name, s.Pods-s.OKPods, s.Pods)
		type key struct {
			verb, plugin, msg string
			code              uint
			cleanup           bool
		}
		count := map[key]int{}
		first := map[key]int{}
		var keys []key
		for _, f := range s.Failures {
			k := key{f.Verb, f.Plugin, f.Msg, f.Code, f.Cleanup}
			if count[k] == 0 {
				keys = append(keys, k)
				first[k] = f.Pod
			}
			count[k]++
		}
		for _, k := range keys {
			where := k.verb
			if k.cleanup {
				where = "DEL after failed ADD"
			}
			if k.plugin != "" {
				where += " in plugin " + k.plugin
			}
			code := ""
			if k.code != 0 {
				code = fmt.Sprintf(" [CNI code %d]", k.code)
			}
			fmt.Fprintf(w, "  %d× (pod %d) %s%s: %s\n", count[k], first[k], where, code, k.msg)
		}
	}
	if len(r.Notes) > 0 {
		fmt.Fprintln(w)
		for _, n := range r.Notes {
			fmt.Fprintf(w, "note: %s\n", n)
		}
	}
}

// printTraces prints the strace breakdown: per set and verb, each plugin
// invocation with the programs it started and the netlink and sysctl
// traffic of the whole tree.
func printTraces(w io.Writer, r *Results, verbose bool) {
	any := false
	for _, s := range r.Sets {
		any = any || len(s.Traces) > 0
	}
	if !any {
		return
	}
	fmt.Fprintln(w, "\nwhere the time goes (traced pods under strace -f --seccomp-bpf; wall ms inflated by tracing, counts exact):")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "set\tverb\tplugin\twall\tprocs\tprograms started (count, wall ms)\trtnl\tnfnl\tsysctl w/r\t")
	for _, s := range r.Sets {
		totals := map[string]*ProgramStats{}
		pods := map[string]int{}
		for _, t := range s.Traces {
			if len(t.Programs) == 0 {
				continue
			}
			if t.Plugin == "bridge" {
				pods[t.Verb]++
			}
			root := t.Programs[0]
			procs, rt, nf, sw, sr := 0, 0, 0, 0, 0
			var kids []string
			for i, p := range t.Programs {
				procs += p.Procs
				rt += p.RtNetlink
				nf += p.NfNetlink
				sw += p.SysctlWrites
				sr += p.SysctlReads
				if i > 0 {
					kids = append(kids, fmt.Sprintf("%s×%d (%.0f)", p.Program, p.Procs, p.WallMS))
				}
			}
			if len(kids) == 0 {
				kids = []string{"-"}
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%.1f\t%d\t%s\t%d\t%d\t%d/%d\t\n", s.Name, t.Verb, t.Plugin, root.WallMS, procs, strings.Join(kids, ", "), rt, nf, sw, sr)
			tot := totals[t.Verb]
			if tot == nil {
				tot = &ProgramStats{}
				totals[t.Verb] = tot
			}
			tot.Procs += procs
			tot.RtNetlink += rt
			tot.NfNetlink += nf
			tot.SysctlWrites += sw
			tot.SysctlReads += sr
			tot.WallMS += root.WallMS
		}
		for _, verb := range slices.Sorted(maps.Keys(totals)) {
			t := totals[verb]
			n := max(pods[verb], 1)
			fmt.Fprintf(tw, "%s\t%s\t= per pod\t%.1f\t%d\t\t%d\t%d\t%d/%d\t\n", s.Name, verb, t.WallMS/float64(n), t.Procs/n, t.RtNetlink/n, t.NfNetlink/n, t.SysctlWrites/n, t.SysctlReads/n)
		}
	}
	tw.Flush()
	if !verbose {
		return
	}
	for _, s := range r.Sets {
		for _, t := range s.Traces {
			for _, p := range t.Programs {
				for _, c := range p.Commands {
					fmt.Fprintf(w, "  %s %s %s: %s\n", s.Name, t.Verb, t.Plugin, c)
				}
				if len(p.Sysctls) > 0 {
					fmt.Fprintf(w, "  %s %s %s: %s writes %s\n", s.Name, t.Verb, t.Plugin, p.Program, strings.Join(p.Sysctls, " "))
				}
			}
		}
	}
}

func mustAddr(ip net.IP) netip.Addr {
	a, _ := netip.AddrFromSlice(ip)
	return a.Unmap()
}
