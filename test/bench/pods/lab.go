package main

// What the harness reads from the lab besides the API: the agent's
// command line (/proc), the node's conflist, and the runtime's CNI
// timings on the agent's metrics endpoint (../promhist).

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"github.com/flatnet/flatnet/internal/lab"
	"github.com/flatnet/flatnet/internal/lab/runtime/process"
	"github.com/flatnet/flatnet/internal/proc"
	"github.com/flatnet/flatnet/test/bench/promhist"
)

// metricsAddr is the agent's --metrics-bind-address in the lab (its
// default), inside the node's namespace.
const metricsAddr = "127.0.0.1:10249"

// agentFlag is the value of flag in the running agent's command line.
func agentFlag(s *lab.Spec, n lab.Node, flag string) (string, error) {
	pid, ok := proc.Running(s.StateDir, lab.AgentProc(n.Name))
	if !ok {
		return "", fmt.Errorf("the agent of %s is not running", n.Name)
	}
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/cmdline")
	if err != nil {
		return "", err
	}
	argv := strings.Split(strings.TrimRight(string(b), "\x00"), "\x00")
	for i, a := range argv {
		if a == flag && i+1 < len(argv) {
			return argv[i+1], nil
		}
		if v, ok := strings.CutPrefix(a, flag+"="); ok {
			return v, nil
		}
	}
	return "", nil
}

// firstPluginType is the type of the first plugin of the first conflist
// in dir (the one the runtime uses, as libcni orders them).
func firstPluginType(dir string) (string, error) {
	files, err := filepath.Glob(filepath.Join(dir, "*.conflist"))
	if err != nil || len(files) == 0 {
		return "", fmt.Errorf("no conflist in %s", dir)
	}
	sort.Strings(files)
	b, err := os.ReadFile(files[0])
	if err != nil {
		return "", err
	}
	var list struct {
		Plugins []struct {
			Type string `json:"type"`
		} `json:"plugins"`
	}
	if err := json.Unmarshal(b, &list); err != nil {
		return "", fmt.Errorf("%s: %w", files[0], err)
	}
	if len(list.Plugins) == 0 {
		return "", fmt.Errorf("%s: no plugins", files[0])
	}
	return list.Plugins[0].Type, nil
}

// cniReading is the runtime's CNI histograms and error counts at one time.
type cniReading struct {
	Add, Del       promhist.Hist
	AddErr, DelErr float64
}

// cniHist reads the runtime's CNI timings from the agent.
func (b *bench) cniHist() (cniReading, error) {
	mf, err := promhist.Scrape(lab.NetnsPath(b.node.Netns), metricsAddr)
	if err != nil {
		return cniReading{}, fmt.Errorf("the agent's metrics: %w", err)
	}
	if mf[process.CNIDurationMetric] == nil {
		// Registered with the agent's runtime: present from the start.
		return cniReading{}, fmt.Errorf("the agent's metrics have no %s (an agent from before the runtime's CNI timings?)", process.CNIDurationMetric)
	}
	errs := func(op string) float64 {
		var n float64
		if f := mf[process.CNIErrorsMetric]; f != nil {
			for _, m := range f.GetMetric() {
				for _, l := range m.GetLabel() {
					if l.GetName() == "operation_type" && l.GetValue() == op {
						n += m.GetCounter().GetValue()
					}
				}
			}
		}
		return n
	}
	return cniReading{
		Add:    promhist.Histogram(mf, process.CNIDurationMetric, "operation_type", "ADD"),
		Del:    promhist.Histogram(mf, process.CNIDurationMetric, "operation_type", "DEL"),
		AddErr: errs("ADD"), DelErr: errs("DEL"),
	}, nil
}
