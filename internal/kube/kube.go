// Package kube holds what flatnet's daemons (agent, controller) share for
// talking to the API server: the client from a kubeconfig (or the
// in-cluster service account) and klog's verbosity flags.
package kube

import (
	"context"
	goflag "flag"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	corev1 "k8s.io/api/core/v1"

	"github.com/spf13/pflag"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"k8s.io/klog/v2"
)

// The client-side rate limit of Config: daemons list every Node at start,
// and client-go's default (5 qps) would make a restart crawl on a large
// cluster. `flatnet controller` sets its own (--kube-api-qps,
// --kube-api-burst).
const (
	DefaultQPS   = 50
	DefaultBurst = 100
)

// Config returns a client config from kubeconfig, or the in-cluster one
// when kubeconfig is empty (a Pod with a service account), limited to
// DefaultQPS and DefaultBurst.
func Config(kubeconfig, userAgent string) (*rest.Config, error) {
	var (
		cfg *rest.Config
		err error
	)
	if kubeconfig == "" {
		cfg, err = rest.InClusterConfig()
		if err != nil {
			return nil, fmt.Errorf("no --kubeconfig given and not running in a cluster: %w", err)
		}
	} else {
		cfg, err = clientcmd.BuildConfigFromFlags("", kubeconfig)
		if err != nil {
			return nil, fmt.Errorf("loading kubeconfig %s: %w", kubeconfig, err)
		}
	}
	cfg.UserAgent = userAgent
	cfg.QPS, cfg.Burst = DefaultQPS, DefaultBurst
	// Protobuf for the built-in types, as kube-proxy and the kubelet
	// default to: decoding thousands of Services and EndpointSlices at
	// start costs a fraction of JSON's CPU.
	cfg.ContentType = "application/vnd.kubernetes.protobuf"
	cfg.AcceptContentTypes = "application/vnd.kubernetes.protobuf,application/json"
	// No gzip, as kube-controller-manager and kube-scheduler (kubernetes
	// PR 80919): between a node and its apiserver the network is not the
	// bottleneck, the CPU is, on both sides. The apiserver compresses every
	// large response and watch stream per connection, for every node's
	// agent; in the agent, gunzipping its watches was 9 % of its CPU while
	// 500 of 5,000 nodes were replaced (perf, docs/scale.md).
	cfg.DisableCompression = true
	return cfg, nil
}

// Client returns a clientset for kubeconfig (see Config).
func Client(kubeconfig, userAgent string) (kubernetes.Interface, error) {
	return ClientWithRate(kubeconfig, userAgent, DefaultQPS, DefaultBurst)
}

// ClientWithRate is Client sending at most qps requests a second on
// average and burst at once.
func ClientWithRate(kubeconfig, userAgent string, qps float32, burst int) (kubernetes.Interface, error) {
	cfg, err := Config(kubeconfig, userAgent)
	if err != nil {
		return nil, err
	}
	cfg.QPS, cfg.Burst = qps, burst
	c, err := kubernetes.NewForConfig(cfg)
	if err != nil {
		return nil, fmt.Errorf("building the API client: %w", err)
	}
	return c, nil
}

// ListFirst is c for an informer factory whose informers must start from
// one LIST rather than a WatchList stream. client-go 1.35+ starts every
// informer with a watch that replays each object as an event
// (WatchListClient, on by default): it spares a huge LIST's memory on both
// ends, but each object is framed, decoded and queued on its own. For the
// agent's Node cache, which gates its start, that stream took 0.7-1.4 s
// and 0.54-0.81 CPU-s for 5,000 kubelet-like Nodes where one LIST took
// 0.4-0.7 s and 0.37-0.50 CPU-s (docs/scale.md). The reflector asks its
// client whether it handles WatchList (IsWatchListSemanticsUnSupported,
// as client-go's fake clientset answers); this says it does not.
func ListFirst(c kubernetes.Interface) kubernetes.Interface { return listFirst{c} }

type listFirst struct{ kubernetes.Interface }

func (listFirst) IsWatchListSemanticsUnSupported() bool { return true }

// AddLogFlags adds klog's -v and --vmodule to fs.
func AddLogFlags(fs *pflag.FlagSet) {
	gfs := goflag.NewFlagSet("klog", goflag.ContinueOnError)
	klog.InitFlags(gfs)
	for _, name := range []string{"v", "vmodule"} {
		fs.AddGoFlag(gfs.Lookup(name))
	}
}

// SignalContext returns a context cancelled on SIGINT or SIGTERM, and a
// logger in it.
func SignalContext(parent context.Context, name string) (context.Context, context.CancelFunc) {
	if parent == nil {
		parent = context.Background()
	}
	ctx, cancel := signal.NotifyContext(parent, os.Interrupt, syscall.SIGTERM)
	return klog.NewContext(ctx, klog.Background().WithName(name)), cancel
}

// NodeReady reports whether n's Ready condition is True.
func NodeReady(n *corev1.Node) bool {
	for _, c := range n.Status.Conditions {
		if c.Type == corev1.NodeReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}
