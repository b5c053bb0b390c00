// Package cnp runs the upstream ClusterNetworkPolicy conformance suite
// (sigs.k8s.io/network-policy-api v0.3.0, conformance/) against a cluster:
// the suite's own fixtures, tests and report, nothing of them changed. It is
// a module of its own so that controller-runtime and the suite stay out of
// flatnet's module graph; `hack/conformance.sh` (PHASES=cnp) brings up a lab,
// runs this test with `go test -json` and turns the events into
// docs/conformance/cnp/ (cmd/cnp-report).
//
//	KUBECONFIG=... go test -count=1 -timeout 2h -v . -args \
//	    -conformance-profiles=ClusterNetworkPolicy -report-output=report.yaml \
//	    -skip-tests='CNPAdminTierEgressSCTP=why,...'
//
// Flags are the suite's own (conformance/utils/flags: -supported-features,
// -exempt-features, -conformance-profiles, -report-output, -debug, ...) plus
// -skip-tests, which fills the suite's SkipTests option (upstream's test
// has no flag for it) and carries each skip's reason into the log, -sctp
// (sctp.go), and -baseline, which first checks what every test relies on.
package cnp

import (
	"flag"
	"fmt"
	"os"
	"sort"
	"strings"
	"testing"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/client-go/kubernetes"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/config"
	"sigs.k8s.io/yaml"

	api "sigs.k8s.io/network-policy-api/apis/v1beta1"
	confv1a1 "sigs.k8s.io/network-policy-api/conformance/apis/v1alpha1"
	"sigs.k8s.io/network-policy-api/conformance/tests"
	"sigs.k8s.io/network-policy-api/conformance/utils/flags"
	k8s "sigs.k8s.io/network-policy-api/conformance/utils/kubernetes"
	"sigs.k8s.io/network-policy-api/conformance/utils/suite"
)

var (
	skipTests = flag.String("skip-tests", "", "tests to skip through the suite's SkipTests option: comma-separated ShortName=reason")
	sctp      = flag.String("sctp", "auto", "auto: skip the tests that probe SCTP when this kernel has none (sctp.go); on: run them whatever the kernel")
	baseline  = flag.Bool("baseline", true, "before the suite's tests, probe between the fixture's pods with no policy (every probe must connect)")
	version   = flag.String("flatnet-version", "dev", "flatnet's version, for the report")
)

// parseSkips reads -skip-tests: ShortName=reason, comma-separated (a
// reason may not hold a comma).
func parseSkips(s string) (map[string]string, error) {
	out := map[string]string{}
	for _, item := range strings.Split(s, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		name, why, ok := strings.Cut(item, "=")
		if !ok || strings.TrimSpace(why) == "" {
			return nil, fmt.Errorf("-skip-tests: %q has no reason (want ShortName=reason)", item)
		}
		out[strings.TrimSpace(name)] = strings.TrimSpace(why)
	}
	return out, nil
}

func TestClusterNetworkPolicyConformance(t *testing.T) {
	if os.Getenv("KUBECONFIG") == "" {
		t.Fatal("KUBECONFIG is not set: run this through `PHASES=cnp hack/conformance.sh`, or point it at a cluster with the ClusterNetworkPolicy CRDs v0.3.0")
	}
	skips, err := parseSkips(*skipTests)
	if err != nil {
		t.Fatal(err)
	}
	switch *sctp {
	case "auto":
		more, err := sctpSkips()
		if err != nil {
			t.Fatal(err)
		}
		for n, why := range more {
			if _, given := skips[n]; !given {
				skips[n] = why
			}
		}
	case "on":
	default:
		t.Fatalf("-sctp=%q: want auto or on", *sctp)
	}
	known := map[string]bool{}
	for _, ct := range tests.ConformanceTests {
		known[ct.ShortName] = true
	}
	var names []string
	for n := range skips {
		if !known[n] {
			t.Fatalf("-skip-tests names %q, which the suite does not have", n)
		}
		names = append(names, n)
	}
	sort.Strings(names)
	for _, n := range names {
		// cmd/cnp-report reads these lines.
		t.Logf("SKIP-TEST %s: %s", n, skips[n])
	}

	cfg, err := config.GetConfig()
	if err != nil {
		t.Fatalf("loading the kubeconfig: %v", err)
	}
	c, err := client.New(cfg, client.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if err := api.Install(c.Scheme()); err != nil {
		t.Fatal(err)
	}
	if err := apiextensionsv1.AddToScheme(c.Scheme()); err != nil {
		t.Fatal(err)
	}
	cs, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		t.Fatal(err)
	}

	profiles := suite.ParseConformanceProfiles(*flags.ConformanceProfiles)
	if profiles.Len() == 0 {
		profiles.Insert(suite.CNPConformanceProfileName)
	}
	s, err := suite.NewConformanceProfileTestSuite(suite.ConformanceProfileOptions{
		Options: suite.Options{
			Client:                     c,
			ClientSet:                  cs,
			KubeConfig:                 *cfg,
			Debug:                      *flags.ShowDebug,
			CleanupBaseResources:       *flags.CleanupBaseResources,
			SupportedFeatures:          suite.ParseSupportedFeatures(*flags.SupportedFeatures),
			ExemptFeatures:             suite.ParseSupportedFeatures(*flags.ExemptFeatures),
			EnableAllSupportedFeatures: *flags.EnableAllSupportedFeatures,
			SkipTests:                  names,
		},
		Implementation:      implementation(),
		ConformanceProfiles: profiles,
	})
	if err != nil {
		t.Fatalf("creating the conformance suite: %v", err)
	}
	s.Setup(t)
	if *baseline {
		t.Run("LabBaseline", func(t *testing.T) { probeBaseline(t, s) })
	}
	if err := s.Run(t, tests.ConformanceTests); err != nil {
		t.Fatal(err)
	}
	report, err := s.Report()
	if err != nil {
		t.Fatalf("the suite's report: %v", err)
	}
	b, err := yaml.Marshal(report)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("Conformance report:\n%s", b)
	if *flags.ReportOutput != "" {
		if err := os.WriteFile(*flags.ReportOutput, b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// implementation is the report's implementation block: the suite's flags,
// or flatnet's defaults where they are empty.
func implementation() confv1a1.Implementation {
	or := func(v, def string) string {
		if v != "" {
			return v
		}
		return def
	}
	return confv1a1.Implementation{
		Organization: or(*flags.ImplementationOrganization, "flatnet"),
		Project:      or(*flags.ImplementationProject, "flatnet"),
		URL:          or(*flags.ImplementationURL, "https://github.com/flatnet/flatnet"),
		Version:      or(*flags.ImplementationVersion, *version),
		Contact:      strings.Split(or(*flags.ImplementationContact, "flatnet maintainers"), ","),
		AdditionalInformation: or(*flags.ImplementationAdditionalInformation,
			"PHASES=cnp hack/conformance.sh on a flatnet lab with real nodes (docs/conformance.md)"),
	}
}

// probeBaseline checks what every test of the suite relies on before any
// policy exists: exec into a client container works and each probe the
// tests use (TCP 80 and 8080, UDP 53 and 5353, agnhost connect) connects
// from gryffindor to a pod of every other house, on the suite's own probe
// helper. A failure here is the lab's or the data plane's, not a policy's.
func probeBaseline(t *testing.T, s *suite.ConformanceProfileTestSuite) {
	for _, server := range []struct{ ns, pod string }{
		{"network-policy-conformance-slytherin", "draco-malfoy-0"},
		{"network-policy-conformance-hufflepuff", "cedric-diggory-1"},
		{"network-policy-conformance-ravenclaw", "luna-lovegood-0"},
		{"network-policy-conformance-gryffindor", "harry-potter-1"},
	} {
		p := k8s.GetPod(t, s.Client, server.ns, server.pod, s.TimeoutConfig.GetTimeout)
		for _, probe := range []struct {
			proto string
			port  int32
		}{{"tcp", 80}, {"tcp", 8080}, {"udp", 53}, {"udp", 5353}} {
			k8s.PokeServer(t, s.ClientSet, &s.KubeConfig, "network-policy-conformance-gryffindor", "harry-potter-0",
				probe.proto, p.Status.PodIP, probe.port, s.TimeoutConfig, true)
		}
	}
}
