// Command podsbench is the Go half of hack/bench-pods.sh (make bench-pods):
// a burst of pods started and stopped on one lab node, with the share of
// the pod network in it (docs/benchmarks.md, "Burst start-up in the lab").
//
// Design. A running 1-node lab on the process runtime. For each set of CNI
// plugins -- the flatnet conflist (flatnet-cni as the plugin type flatnet),
// the classic conflist (flatnet-cni as bridge, host-local, bandwidth and
// portmap) and the classic conflist with the reference plugins of
// containernetworking/plugins (lab up --cni-bin-dir) -- the harness
// switches the lab to it with `flatnet lab up` (which restarts the agent),
// checks the switch took (the node's conflist, the agent's command line),
// then:
//
//   - creates N bare pods at once (one goroutine each; the scheduler binds
//     them, the agent's runtime starts them) and times create -> every pod
//     Ready, from a watch started before the first create;
//   - deletes them at once and times delete -> every pod gone from the API
//     (the runtime deletes a Pod object last, after CNI DEL);
//   - reads the runtime's own CNI timings, the histogram
//     flatnet_runtime_network_plugin_operations_duration_seconds on the
//     agent's metrics endpoint, before, between and after: the differences
//     are this run's ADDs and DELs (count, sum exact; median and p90 read
//     from the buckets as histogram_quantile does, within a bucket's 25 %).
//
// The network's share is reported two ways: the sum of ADD (DEL) time over
// the wall time of the burst (CNI-seconds per second: above 1 when several
// run at once), and the median ADD over the median pod's own start (burst
// start -> that pod Ready). Sets alternate run by run so that whatever
// else loads the machine falls on all of them. Any failed step, a CNI
// error counted by the runtime, or a count of operations other than N,
// fails the run and the command.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/flatnet/flatnet/internal/lab"
)

// set is one choice of conflist and plugins.
type set struct {
	Name     string
	Conflist string // lab up --cni-conflist
	Ref      bool   // lab up --cni-bin-dir <the reference plugins>
}

var allSets = []set{
	{Name: "flatnet", Conflist: "flatnet"},
	{Name: "classic", Conflist: "classic"},
	{Name: "classic-ref", Conflist: "classic", Ref: true},
}

type config struct {
	Flatnet, Root, Lab, RefDir string
	Pods, Runs                 int
	Sets                       []set
	Timeout                    time.Duration
	JSON                       string
	Log                        string
}

func main() {
	var c config
	var sets string
	flag.StringVar(&c.Flatnet, "flatnet", "bin/flatnet", "the flatnet binary that runs the lab")
	flag.StringVar(&c.Root, "state-dir", lab.DefaultStateRoot, "the lab's --state-dir")
	flag.StringVar(&c.Lab, "lab", "benchpods", "the lab's --name (a running 1-node lab, process runtime)")
	flag.StringVar(&c.RefDir, "ref", "", "the reference CNI plugins' directory (for the classic-ref set)")
	flag.IntVar(&c.Pods, "pods", 100, "pods per burst")
	flag.IntVar(&c.Runs, "runs", 3, "runs of each set, alternating sets")
	flag.StringVar(&sets, "sets", "flatnet,classic,classic-ref", "the sets, in the order they take turns")
	flag.DurationVar(&c.Timeout, "timeout", 5*time.Minute, "bound on each phase (a switch, a start, a stop)")
	flag.StringVar(&c.JSON, "json", "", "also write the results here as JSON")
	flag.StringVar(&c.Log, "log", "", "append the output of each lab up here (default: discarded unless it fails)")
	flag.Parse()
	for _, n := range strings.Split(sets, ",") {
		i := slices.IndexFunc(allSets, func(s set) bool { return s.Name == n })
		if i < 0 {
			fail(fmt.Errorf("-sets: no set %q (want flatnet, classic, classic-ref)", n))
		}
		if allSets[i].Ref && c.RefDir == "" {
			fail(fmt.Errorf("-sets %s needs -ref, the reference plugins' directory (hack/ref-cni.sh prints it)", n))
		}
		c.Sets = append(c.Sets, allSets[i])
	}
	if c.Pods < 1 || c.Runs < 1 {
		fail(errors.New("-pods and -runs must be at least 1"))
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	results, err := run(ctx, c)
	printTable(os.Stdout, c, results)
	if c.JSON != "" {
		if b, jerr := json.MarshalIndent(results, "", "  "); jerr != nil {
			err = errors.Join(err, jerr)
		} else if werr := os.WriteFile(c.JSON, append(b, '\n'), 0o644); werr != nil {
			err = errors.Join(err, werr)
		}
	}
	if err != nil {
		fail(err)
	}
}

func fail(err error) {
	fmt.Fprintf(os.Stderr, "podsbench: %v\n", err)
	os.Exit(1)
}

// run runs every set c.Runs times, alternating, and stops at the first
// failure (the results so far are returned with it).
func run(ctx context.Context, c config) ([]result, error) {
	spec, err := lab.LoadSpec(c.Root, c.Lab)
	if err != nil {
		return nil, err
	}
	if len(spec.Nodes) != 1 || spec.Containerd() {
		return nil, fmt.Errorf("lab %s: want 1 node on the process runtime (it has %d, runtime %s)", c.Lab, len(spec.Nodes), spec.RuntimeName())
	}
	rc, err := clientcmd.BuildConfigFromFlags("", spec.Kubeconfig())
	if err != nil {
		return nil, fmt.Errorf("loading the lab's kubeconfig: %w", err)
	}
	// Creates and deletes go out at once: no client-side throttling.
	rc.QPS, rc.Burst = 1000, 1000
	client, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, err
	}
	b := &bench{c: c, client: client, node: spec.Nodes[0]}
	if err := b.namespace(ctx); err != nil {
		return nil, err
	}
	var out []result
	for r := 1; r <= c.Runs; r++ {
		for _, s := range c.Sets {
			if err := b.switchTo(ctx, s); err != nil {
				return out, fmt.Errorf("set %s: %w", s.Name, err)
			}
			res, err := b.burst(ctx, s, r)
			if err != nil {
				return out, fmt.Errorf("set %s, run %d: %w", s.Name, r, err)
			}
			out = append(out, res)
			fmt.Fprintf(os.Stderr, "podsbench: %s run %d: all Ready in %.2fs, all gone in %.2fs\n", s.Name, r, res.ReadySeconds, res.GoneSeconds)
		}
	}
	return out, nil
}

// switchTo brings the lab to set s (lab up restarts the agent when its
// conflist or plugin dir differ) and checks that it took.
func (b *bench) switchTo(ctx context.Context, s set) error {
	ctx, cancel := context.WithTimeout(ctx, b.c.Timeout)
	defer cancel()
	binDir := ""
	if s.Ref {
		binDir = b.c.RefDir
	}
	argv := []string{"lab", "--state-dir", b.c.Root, "--name", b.c.Lab, "up", "--cni-conflist", s.Conflist, "--cni-bin-dir", binDir}
	cmd := exec.CommandContext(ctx, b.c.Flatnet, argv...)
	out, err := cmd.CombinedOutput()
	if b.c.Log != "" {
		if f, ferr := os.OpenFile(b.c.Log, os.O_CREATE|os.O_APPEND|os.O_WRONLY, 0o644); ferr == nil {
			fmt.Fprintf(f, "### %s %s\n%s\n", b.c.Flatnet, strings.Join(argv, " "), out)
			f.Close()
		}
	}
	if err != nil {
		return fmt.Errorf("%s %s: %w\n%s", b.c.Flatnet, strings.Join(argv, " "), err, out)
	}
	spec, err := lab.LoadSpec(b.c.Root, b.c.Lab)
	if err != nil {
		return err
	}
	return b.inForce(ctx, spec, s)
}

// inForce waits until the node's conflist is of s's style and the agent
// runs with s's plugin path, and its metrics endpoint answers.
func (b *bench) inForce(ctx context.Context, spec *lab.Spec, s set) error {
	n := spec.Nodes[0]
	wantType := map[string]string{"flatnet": "flatnet", "classic": "bridge"}[s.Conflist]
	wantBin := spec.CNIBinDir()
	if s.Ref {
		wantBin = filepath.Clean(b.c.RefDir) + string(filepath.ListSeparator) + spec.CNIBinDir()
	}
	var last error
	for {
		last = func() error {
			if got := spec.AgentCNIBinDir(); got != wantBin {
				return fmt.Errorf("the lab records the agents' --cni-bin-dir %s, want %s", got, wantBin)
			}
			if got, err := agentFlag(spec, n, "--cni-bin-dir"); err != nil || got != wantBin {
				return fmt.Errorf("the agent runs with --cni-bin-dir %q (%v), want %s", got, err, wantBin)
			}
			if got, err := firstPluginType(spec.CNIConfDir(n)); err != nil || got != wantType {
				return fmt.Errorf("the node's conflist starts with plugin type %q (%v), want %s", got, err, wantType)
			}
			_, err := b.cniHist()
			return err
		}()
		if last == nil {
			return nil
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("set %s not in force: %w", s.Name, last)
		case <-time.After(200 * time.Millisecond):
		}
	}
}
