// Package gateway runs the Gateway API conformance suite
// (sigs.k8s.io/gateway-api/conformance v1.6.3) against a cluster: the
// suite's own base manifests, tests, timeouts and report, nothing of them
// changed, as upstream's conformance.RunConformanceWithOptions runs them,
// with flatnet's defaults. A module of its own (like test/cnp) so that
// controller-runtime and the suite stay out of flatnet's module graph; it
// requires sigs.k8s.io/gateway-api and .../conformance at the same version
// (the conformance module's `replace ../` is ignored in a dependency).
// `hack/conformance.sh` (PHASES=gateway) brings up a lab with an external
// host, runs this test in that host's network namespace (the only place the
// lab's LoadBalancer range is routed to) and turns its `go test -json`
// events into docs/conformance/gateway/summary.md (cmd/gateway-report).
//
//	KUBECONFIG=... go test -count=1 -timeout 2h -v . -args \
//	    -report-output=report.yaml -flatnet-version=$(git describe --always) \
//	    [-run-test=HTTPRouteSimpleSameNamespace]
//
// Flags are the suite's own (conformance/utils/flags: -gateway-class,
// -supported-features, -exempt-features, -conformance-profiles, -run-test,
// -skip-tests, -report-output, -organization, ..., -debug), with these
// defaults where a flag is not given: GatewayClass flatnet, profile
// GATEWAY-HTTP, the implementation block below. When no feature flag is
// given the suite reads the features from the GatewayClass's
// status.supportedFeatures (GEP-2162); when that is empty this runner
// claims only the profile's core features (the suite would refuse to start).
//
// While the suite sets up (GatewayClass Accepted, base manifests, every
// Gateway Programmed and every pod Ready, 300 s at most) the runner logs
// what it still waits for whenever that changes (SETUP-STATE lines), and
// once more when Setup fails: the suite itself only says "not ready yet".
package gateway

import (
	"context"
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/apimachinery/pkg/util/sets"
	"sigs.k8s.io/controller-runtime/pkg/client"
	gatewayv1 "sigs.k8s.io/gateway-api/apis/v1"
	"sigs.k8s.io/gateway-api/conformance"
	confv1 "sigs.k8s.io/gateway-api/conformance/apis/v1"
	"sigs.k8s.io/gateway-api/conformance/tests"
	"sigs.k8s.io/gateway-api/conformance/utils/flags"
	"sigs.k8s.io/gateway-api/conformance/utils/suite"
	"sigs.k8s.io/gateway-api/pkg/features"
	"sigs.k8s.io/yaml"
)

// GatewayClass is the class `flatnet lab up` creates for flatnet's gateway.
const GatewayClass = "flatnet"

var (
	version    = flag.String("flatnet-version", "dev", "flatnet's version, for the report (when -version is not given)")
	setupEvery = flag.Duration("setup-state-every", 5*time.Second, "how often to look at what Setup still waits for (logged when it changes)")
)

func TestGatewayAPIConformance(t *testing.T) {
	if os.Getenv("KUBECONFIG") == "" {
		t.Fatal("KUBECONFIG is not set: run this through `PHASES=gateway hack/conformance.sh`, or point it at a cluster with the Gateway API CRDs v1.6.3 and GatewayClass flatnet")
	}
	opts := conformance.DefaultOptions(t)
	given := map[string]bool{}
	flag.Visit(func(f *flag.Flag) { given[f.Name] = true })
	if !given["gateway-class"] && *flags.ConformanceOptionsFile == "" {
		opts.GatewayClassName = GatewayClass
	}
	if len(opts.ConformanceProfiles) == 0 {
		opts.ConformanceProfiles = []suite.ConformanceProfileName{suite.GatewayHTTPConformanceProfileName}
	}
	opts.Implementation = implementation(opts.Implementation)
	if err := claimFeatures(t, &opts); err != nil {
		t.Fatal(err)
	}
	run(t, opts)
}

// implementation fills the report's implementation block where the
// suite's flags left it empty.
func implementation(i confv1.Implementation) confv1.Implementation {
	or := func(v *string, def string) {
		if *v == "" {
			*v = def
		}
	}
	or(&i.Organization, "flatnet")
	or(&i.Project, "flatnet")
	or(&i.URL, "https://github.com/flatnet/flatnet")
	or(&i.Version, *version)
	if len(i.Contact) == 0 {
		i.Contact = []string{"https://github.com/flatnet/flatnet/issues"}
	}
	return i
}

// claimFeatures: when the suite would infer the supported features from
// the GatewayClass (no feature flag, no -run-test) and the class publishes
// none, claim the profiles' core features instead of letting the suite
// stop with "no supported features were determined".
func claimFeatures(t *testing.T, opts *suite.ConformanceOptions) error {
	if opts.EnableAllSupportedFeatures || len(opts.SupportedFeatures) > 0 || len(opts.ExemptFeatures) > 0 || opts.RunTest != "" {
		return nil
	}
	var gwc gatewayv1.GatewayClass
	err := opts.Client.Get(context.Background(), types.NamespacedName{Name: opts.GatewayClassName}, &gwc)
	if apierrors.IsNotFound(err) {
		return fmt.Errorf("GatewayClass %s not found: `flatnet lab up` creates it (or pass -gateway-class)", opts.GatewayClassName)
	}
	if err != nil {
		return fmt.Errorf("reading GatewayClass %s: %w", opts.GatewayClassName, err)
	}
	if len(gwc.Status.SupportedFeatures) > 0 {
		return nil
	}
	core := sets.New[features.FeatureName]()
	for _, p := range opts.ConformanceProfiles {
		if p == suite.GatewayHTTPConformanceProfileName {
			core = core.Union(suite.GatewayHTTPConformanceProfile.CoreFeatures)
		}
	}
	if core.Len() == 0 {
		return fmt.Errorf("GatewayClass %s publishes no status.supportedFeatures: pass -supported-features", opts.GatewayClassName)
	}
	opts.SupportedFeatures = sets.List(core)
	t.Logf("GatewayClass %s publishes no status.supportedFeatures: claiming the core features only (%v)", opts.GatewayClassName, opts.SupportedFeatures)
	return nil
}

// run is upstream's RunConformanceWithOptions with the setup watcher, the
// claimed features logged for cmd/gateway-report, and the report written
// readable by all.
func run(t *testing.T, opts suite.ConformanceOptions) {
	if opts.ReportOutputPath != "" {
		if err := opts.Implementation.Validate(); err != nil {
			t.Fatalf("the report's implementation block: %v", err)
		}
	}
	cs, err := suite.NewConformanceTestSuite(opts)
	if err != nil {
		t.Fatalf("creating the conformance suite: %v", err)
	}
	// cmd/gateway-report reads these lines.
	t.Logf("SUPPORTED-FEATURES %s", joinFeatures(sets.List(cs.SupportedFeatures)))
	t.Logf("GATEWAY-CLASS %s PROFILES %v", opts.GatewayClassName, opts.ConformanceProfiles)
	if opts.ReportOutputPath != "" {
		// A cleanup: parallel tests finish after Run returns.
		t.Cleanup(func() {
			report, err := cs.Report()
			if err != nil {
				t.Errorf("the suite's report: %v", err)
				return
			}
			b, err := yaml.Marshal(report)
			if err != nil {
				t.Error(err)
				return
			}
			if err := os.WriteFile(opts.ReportOutputPath, b, 0o644); err != nil {
				t.Error(err)
			}
			t.Logf("Conformance report:\n%s", b)
		})
	}
	w := watchSetup(t, opts)
	setUp := false
	// A defer, not a cleanup: it runs before the suite's cleanups delete
	// the base manifests, so a failed Setup is seen as it was.
	defer func() { w.stop(!setUp) }()
	cs.Setup(t, tests.ConformanceTests)
	setUp = true
	w.stop(false)
	if err := cs.Run(t, tests.ConformanceTests); err != nil {
		t.Fatal(err)
	}
}

func joinFeatures(fs []features.FeatureName) string {
	var s []string
	for _, f := range fs {
		s = append(s, string(f))
	}
	return strings.Join(s, ",")
}

// watcher logs what Setup waits for.
type watcher struct {
	t      *testing.T
	opts   suite.ConformanceOptions
	cancel context.CancelFunc
	done   chan struct{}
	once   sync.Once
}

func watchSetup(t *testing.T, opts suite.ConformanceOptions) *watcher {
	ctx, cancel := context.WithCancel(context.Background())
	w := &watcher{t: t, opts: opts, cancel: cancel, done: make(chan struct{})}
	go func() {
		defer close(w.done)
		last := ""
		tick := time.NewTicker(*setupEvery)
		defer tick.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
			if s := setupState(ctx, opts); s != last && ctx.Err() == nil {
				t.Logf("SETUP-STATE\n%s", s)
				last = s
			}
		}
	}()
	return w
}

// stop ends the watcher; failed logs the state once more.
func (w *watcher) stop(failed bool) {
	w.once.Do(func() {
		w.cancel()
		<-w.done
		if failed {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			w.t.Logf("SETUP-STATE at the end of a failed Setup\n%s", setupState(ctx, w.opts))
		}
	})
}

// setupState is what Setup waits for, one line per object that is not
// there yet: the GatewayClass's Accepted condition, each Gateway's
// Accepted and Programmed, each pod not Ready with why; then the count of
// Ready pods per namespace.
func setupState(ctx context.Context, opts suite.ConformanceOptions) string {
	var b strings.Builder
	var gwc gatewayv1.GatewayClass
	if err := opts.Client.Get(ctx, types.NamespacedName{Name: opts.GatewayClassName}, &gwc); err != nil {
		fmt.Fprintf(&b, "  GatewayClass %s: %v\n", opts.GatewayClassName, err)
	} else if c := condition(gwc.Status.Conditions, "Accepted"); c != "True" {
		fmt.Fprintf(&b, "  GatewayClass %s: Accepted=%s\n", gwc.Name, c)
	}
	for _, ns := range []string{suite.InfrastructureNamespace, suite.AppBackendNamespace, suite.WebBackendNamespace} {
		var gws gatewayv1.GatewayList
		if err := opts.Client.List(ctx, &gws, client.InNamespace(ns)); err != nil {
			fmt.Fprintf(&b, "  %s: listing Gateways: %v\n", ns, err)
		}
		for _, gw := range gws.Items {
			a, p := condition(gw.Status.Conditions, "Accepted"), condition(gw.Status.Conditions, "Programmed")
			if a != "True" || p != "True" {
				fmt.Fprintf(&b, "  Gateway %s/%s: Accepted=%s Programmed=%s\n", ns, gw.Name, a, p)
			}
		}
		pods, err := opts.Clientset.CoreV1().Pods(ns).List(ctx, metav1.ListOptions{})
		if err != nil {
			fmt.Fprintf(&b, "  %s: listing pods: %v\n", ns, err)
			continue
		}
		ready := 0
		for i := range pods.Items {
			p := &pods.Items[i]
			if why := notReady(p); why != "" {
				fmt.Fprintf(&b, "  Pod %s/%s (node %s): %s\n", ns, p.Name, p.Spec.NodeName, why)
				continue
			}
			ready++
		}
		fmt.Fprintf(&b, "  %s: %d of %d pods Ready\n", ns, ready, len(pods.Items))
	}
	return strings.TrimRight(b.String(), "\n")
}

// condition is "Status (Reason: Message)" of the condition of that type,
// "True" alone, or "none".
func condition(conds []metav1.Condition, typ string) string {
	for _, c := range conds {
		if c.Type != typ {
			continue
		}
		if c.Status == metav1.ConditionTrue {
			return "True"
		}
		return fmt.Sprintf("%s (%s: %s)", c.Status, c.Reason, c.Message)
	}
	return "none"
}

// notReady says why p is not Ready ("" when it is, or succeeded, as the
// suite counts).
func notReady(p *corev1.Pod) string {
	if p.Status.Phase == corev1.PodSucceeded || p.DeletionTimestamp != nil {
		return ""
	}
	for _, c := range p.Status.Conditions {
		if c.Type == corev1.PodReady && c.Status == corev1.ConditionTrue {
			return ""
		}
	}
	why := []string{"phase " + string(p.Status.Phase)}
	for _, c := range p.Status.Conditions {
		if c.Status != corev1.ConditionTrue && c.Reason != "" {
			why = append(why, fmt.Sprintf("%s=%s %s", c.Type, c.Reason, c.Message))
		}
	}
	for _, cs := range p.Status.ContainerStatuses {
		switch {
		case cs.State.Waiting != nil:
			why = append(why, fmt.Sprintf("container %s waiting: %s %s", cs.Name, cs.State.Waiting.Reason, cs.State.Waiting.Message))
		case cs.State.Terminated != nil:
			why = append(why, fmt.Sprintf("container %s terminated: %s exit %d", cs.Name, cs.State.Terminated.Reason, cs.State.Terminated.ExitCode))
		}
		if cs.RestartCount > 0 {
			why = append(why, fmt.Sprintf("%d restarts", cs.RestartCount))
		}
	}
	return strings.Join(slices.Compact(why), "; ")
}
