package controller

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/spf13/cobra"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/client-go/discovery"
	"k8s.io/client-go/kubernetes"
	"k8s.io/klog/v2"
	gwv1 "sigs.k8s.io/gateway-api/apis/v1"
	gwclient "sigs.k8s.io/gateway-api/pkg/client/clientset/versioned"

	"github.com/flatnet/flatnet/internal/gateway/proxy"
	"github.com/flatnet/flatnet/internal/httpserver"
	"github.com/flatnet/flatnet/internal/kube"
)

// Flags are the command's flags.
type Flags struct {
	Kubeconfig         string
	NodeName           string
	Namespace          string
	BindAddress        string
	BindPortRange      string
	Ingress            bool
	IngressHTTPPort    int32
	IngressHTTPSPort   int32
	LeaderElect        bool
	MetricsBindAddress string
	AccessLog          string
}

// DefaultMetricsBindAddress serves /metrics and /healthz.
const DefaultMetricsBindAddress = "127.0.0.1:9082"

// NewCommand is `flatnet gateway`.
func NewCommand() *cobra.Command {
	f := Flags{}
	cmd := &cobra.Command{
		Use:   "gateway",
		Short: "Run flatnet's L7 gateway on this node: Gateway API (GatewayClass " + "flatnet" + ") and Ingress (class flatnet) served straight to endpoints",
		Long: `flatnet gateway watches Gateway API objects (Gateway, HTTPRoute, GRPCRoute,
ReferenceGrant; GatewayClasses whose controllerName is ` + ControllerName + `)
and Ingresses of IngressClass flatnet, compiles them into one routing table
and serves it with an HTTP/1.1, HTTP/2 and h2c proxy that sends each request
straight to a ready endpoint of the backend Service. A route or endpoint
change swaps the table atomically: no listener restarts, in-flight requests
and WebSockets carry on.

Run it on every node (host network). Each Gateway listener port is served
on a bind port of its own (--bind-port-range); one instance, elected with
the Lease flatnet-gateway in --namespace, keeps a Service of type
LoadBalancer per Gateway (<gateway>-flatnet-gw, externalTrafficPolicy
Local) that maps the listener ports to the bind ports on every node, and
writes the statuses. The Gateway's address is that Service's load-balancer
IP. Ingress is served on --ingress-http-port/--ingress-https-port behind
the Service flatnet-ingress in --namespace (ports 80 and 443).

Metrics (flatnet_gateway_*) and /healthz on --metrics-bind-address.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := kube.SignalContext(cmd.Context(), "gateway")
			defer cancel()
			return Run(ctx, f)
		},
	}
	fs := cmd.Flags()
	fs.StringVar(&f.Kubeconfig, "kubeconfig", "", "kubeconfig file (default: the in-cluster service account)")
	fs.StringVar(&f.NodeName, "node-name", os.Getenv("NODE_NAME"), "this node's name: the leader election identity (default $NODE_NAME, else the host name)")
	fs.StringVar(&f.Namespace, "namespace", envOr("POD_NAMESPACE", "kube-system"), "namespace of the leader Lease and the Ingress frontend Service (default $POD_NAMESPACE, else kube-system)")
	fs.StringVar(&f.BindAddress, "bind-address", "", "address the proxy listens on (default: all)")
	fs.StringVar(&f.BindPortRange, "bind-port-range", "20000-29999", "ports handed to Gateway listeners, FIRST-LAST; every node listens on them")
	fs.BoolVar(&f.Ingress, "ingress", true, "serve Ingresses of IngressClass flatnet")
	fs.Int32Var(&f.IngressHTTPPort, "ingress-http-port", 10080, "bind port of Ingress HTTP (Service port 80)")
	fs.Int32Var(&f.IngressHTTPSPort, "ingress-https-port", 10443, "bind port of Ingress HTTPS (Service port 443)")
	fs.BoolVar(&f.LeaderElect, "leader-elect", true, "elect one instance to write statuses and frontend Services; off for a single instance")
	fs.StringVar(&f.MetricsBindAddress, "metrics-bind-address", DefaultMetricsBindAddress, "host:port for /metrics and /healthz; empty turns it off")
	fs.StringVar(&f.AccessLog, "access-log", "", `access log: one JSON line per request to this file, "-" for standard output, empty for none`)
	kube.AddLogFlags(fs)
	return cmd
}

func envOr(k, def string) string {
	if v := os.Getenv(k); v != "" {
		return v
	}
	return def
}

// Run runs the gateway until ctx ends.
func Run(ctx context.Context, f Flags) error {
	log := klog.FromContext(ctx)
	r, err := ParsePortRange(f.BindPortRange)
	if err != nil {
		return err
	}
	for _, p := range []int32{f.IngressHTTPPort, f.IngressHTTPSPort} {
		if p < 1 || p > 65535 {
			return fmt.Errorf("--ingress-http-port/--ingress-https-port %d: want a port 1-65535", p)
		}
		if p >= r.First && p <= r.Last {
			return fmt.Errorf("Ingress bind port %d is inside --bind-port-range %s: move one of them", p, f.BindPortRange)
		}
	}
	cfg, err := kube.Config(f.Kubeconfig, "flatnet-gateway")
	if err != nil {
		return err
	}
	// Status writes at start are one call per object.
	cfg.QPS, cfg.Burst = 200, 400
	kc, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return fmt.Errorf("building the API client: %w", err)
	}
	gc, err := gwclient.NewForConfig(jsonConfig(cfg))
	if err != nil {
		return fmt.Errorf("building the Gateway API client: %w", err)
	}
	if err := waitForGatewayAPI(ctx, kc.Discovery(), log); err != nil {
		return err
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	var accessLog io.Writer
	switch f.AccessLog {
	case "":
	case "-":
		accessLog = os.Stdout
	default:
		fh, err := os.OpenFile(f.AccessLog, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o640)
		if err != nil {
			return fmt.Errorf("--access-log: %w", err)
		}
		defer fh.Close()
		accessLog = fh
	}
	srv := proxy.New(proxy.Options{BindAddress: f.BindAddress, Registry: reg, AccessLog: accessLog, Logger: log})
	defer func() {
		sctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if err := srv.Close(sctx); err != nil {
			log.Error(err, "Closing the proxy")
		}
	}()
	c := New(kc, gc, srv, Options{
		NodeName: f.NodeName, Namespace: f.Namespace, Range: r,
		Ingress: f.Ingress, IngressHTTP: f.IngressHTTPPort, IngressHTTPS: f.IngressHTTPSPort,
		LeaderElect: f.LeaderElect,
	}, log)
	errc := make(chan error, 2)
	if f.MetricsBindAddress != "" {
		mux := http.NewServeMux()
		mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{}))
		mux.HandleFunc("/healthz", c.Healthz)
		go func() { errc <- httpserver.Serve(ctx, f.MetricsBindAddress, mux) }()
	}
	go func() { errc <- c.Run(ctx) }()
	err = <-errc
	if errors.Is(err, context.Canceled) || ctx.Err() != nil {
		return nil
	}
	return err
}

// waitForGatewayAPI waits until the API server serves the Gateway API
// (its CRDs are installed), saying once what is missing.
func waitForGatewayAPI(ctx context.Context, d discovery.DiscoveryInterface, log klog.Logger) error {
	said := false
	return wait.PollUntilContextCancel(ctx, 5*time.Second, true, func(context.Context) (bool, error) {
		rs, err := d.ServerResourcesForGroupVersion(gwv1.GroupVersion.String())
		if err == nil {
			have := map[string]bool{}
			for _, r := range rs.APIResources {
				have[r.Name] = true
			}
			if have["gateways"] && have["httproutes"] && have["gatewayclasses"] && have["referencegrants"] && have["grpcroutes"] {
				return true, nil
			}
		}
		if !said {
			log.Info("Waiting for the Gateway API v1 CRDs (standard channel, v1.6.3: kubectl apply --server-side -f standard-install.yaml)", "err", err)
			said = true
		}
		return false, nil
	})
}
