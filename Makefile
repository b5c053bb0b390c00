# flatnet: see README.md. Targets delegate to small scripts under hack/.
SHELL := /bin/bash
export PATH := /usr/local/go/bin:$(PATH)
VERSION ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X github.com/flatnet/flatnet/internal/cni/plugin.Version=$(VERSION)
CNI_PLUGINS := bridge host-local loopback ptp macvlan bandwidth portmap flatnet flatnet-policy
DESTDIR ?= /opt/cni/bin
GO_TEST_FLAGS ?=

.PHONY: all deps build k8s kwok node images install-cni test test-unit test-e2e-containerd lint fuzz bench-cni demo bench-lab bench-overlay bench-proxy bench-dns bench-policy bench-gateway bench-scale bench-pods conformance conformance-gateway clean

all: build

deps:
	@hack/deps.sh

# flatnet-cni is static (CGO_ENABLED=0): the runtime starts it for every
# CNI verb, and without the dynamic loader a start costs ~2 ms less here
# (docs/benchmarks.md, "Where the time goes").
build:
	@mkdir -p bin
	CGO_ENABLED=0 go build -ldflags '$(LDFLAGS)' -o bin/flatnet-cni ./cmd/flatnet-cni
	go build -ldflags '$(LDFLAGS)' -o bin/flatnet ./cmd/flatnet
	CGO_ENABLED=0 go build -o bin/flatnet-pause ./cmd/flatnet-pause

# k8s: the upstream control plane for the lab (kube-apiserver,
# kube-controller-manager, kube-scheduler, kubectl, etcd), built from the Go
# module proxy into a cache outside git (minutes the first time).
# hack/build-k8s.sh kubelet|agnhost|e2e.test|ginkgo builds the others.
k8s:
	hack/build-k8s.sh

# kwok: kwok (sigs.k8s.io/kwok, pinned in hack/kwok/go.mod), which plays the
# kubelet for the lab's simulated nodes (flatnet lab up --simulated-nodes N),
# built from the Go module proxy into a cache outside git
# (hack/build-kwok.sh --bin-dir says where; about a minute the first time).
kwok:
	hack/build-kwok.sh

# node: what a real lab node runs beside the kubelet (containerd, its runc
# shim, ctr, runc, crictl), built from the Go module proxy into a cache
# outside git (hack/build-node.sh --bin-dir says where); the kubelet is
# hack/build-k8s.sh kubelet.
node:
	hack/build-node.sh

# images: what a lab with real nodes imports into containerd (pause,
# agnhost (also as agnhost:2.45 for the ClusterNetworkPolicy suite, with
# hack/build-agnhost-cnp.sh's porter), glibc-dns-testing, busybox, nginx under
# their upstream names, the Gateway API conformance suite's echo-basic
# (hack/build-echo-basic.sh, v1.5.1 and v1.6.0-dev.3) and coredns:v1.12.2, and
# flatnet:dev) as docker-archive tarballs in
# ${FLATNET_CACHE:-$HOME/.cache/flatnet}/images, rebuilt only when their
# inputs change. agnhost carries CoreDNS (hack/build-coredns.sh) as
# upstream's does. The Debian root under them is made once with debootstrap
# (root, the Debian mirror, about a minute). Prints name, size, time, cached.
images: build
	hack/build-k8s.sh agnhost
	hack/build-agnhost-cnp.sh
	hack/build-coredns.sh
	hack/build-echo-basic.sh
	bin/flatnet lab images

# install-cni: the multi-call binary under every plugin name (a contract).
# The plugin type flatnet shares its name with the flatnet command: a
# directory holding the command (bin/, the lab's bin dir) is refused.
install-cni: build
	@if [ -f $(DESTDIR)/flatnet ] && [ ! -L $(DESTDIR)/flatnet ]; then \
	  echo "install-cni: $(DESTDIR)/flatnet is a file, not a link to flatnet-cni (the flatnet command?); the CNI plugin flatnet would replace it: pick a directory of CNI plugins (DESTDIR=/opt/cni/bin)" >&2; exit 1; fi
	@mkdir -p $(DESTDIR)
	install -m 0755 bin/flatnet-cni $(DESTDIR)/flatnet-cni
	@for p in $(CNI_PLUGINS); do ln -sf flatnet-cni $(DESTDIR)/$$p; done
	@echo "installed flatnet-cni as: $(CNI_PLUGINS) in $(DESTDIR)"

# test: every tier. Root tests run when root (CI is root) and skip with a
# reason otherwise.
test: deps
	hack/test.sh $(GO_TEST_FLAGS)

test-unit:
	go test -count=1 ./...

# test-e2e-containerd: the lab end-to-end tests (test/e2e) with every lab on
# real nodes (FLATNET_E2E_RUNTIME=containerd: lab up --runtime containerd);
# needs root, make k8s, make node and hack/build-k8s.sh kubelet agnhost.
# Without the variable they run on the process runtime.
test-e2e-containerd: node images
	hack/build-k8s.sh kubelet
	FLATNET_E2E_RUNTIME=containerd go test -count=1 -timeout 60m $(GO_TEST_FLAGS) ./test/e2e/

lint:
	@bad=$$(gofmt -l cmd internal test 2>/dev/null); if [ -n "$$bad" ]; then echo "gofmt: $$bad"; exit 1; fi
	go vet ./...

fuzz:
	hack/fuzz.sh

bench-cni: deps
	hack/bench-cni.sh

# demo: the README's first command: a 3-node lab with netexec pods and
# traffic across nodes; the lab keeps running (hack/demo.sh says how to
# explore it and take it down). Needs root.
demo:
	RUNTIME=$(RUNTIME) hack/demo.sh

# bench-lab: time `flatnet lab up` for 3 nodes until a pod on each node
# answers the others (docs/benchmarks.md, Lab). Needs root and make k8s.
bench-lab: build
	hack/bench-lab.sh

# bench-overlay: pod-to-pod TCP throughput and request/response latency
# across two nodes per backend, against node to node, in one run
# (docs/benchmarks.md, Overlay). Needs root and make k8s.
bench-overlay: build
	hack/bench-overlay.sh

# bench-proxy: flatnet's Service proxy in its nftables, iptables and
# userspace modes against upstream kube-proxy in its nftables and iptables
# modes, same apiserver, same run, at 1,000, 5,000 and 10,000 Services
# (docs/benchmarks.md, Service proxy; SIZES, MODES, REPS: see the script).
# Builds kube-proxy into make k8s's cache on first use. Needs root and
# make k8s.
bench-proxy: build
	hack/bench-proxy.sh

# bench-dns: flatnet's cluster DNS against CoreDNS's kubernetes plugin at
# 10,000 Services, one core each, dnsperf on the other, same run
# (docs/benchmarks.md, Cluster DNS). Installs dnsperf and builds CoreDNS
# into make k8s's cache on first use. Needs root and make k8s.
bench-dns: build
	hack/bench-dns.sh

# bench-scale: the control plane and agent at cluster scale: a lab with
# one real node and simulated nodes (kwok), Services and pods, then churn
# (docs/scale.md). SIZE=small (500 nodes, 5,000 pods; four minutes),
# SIZE=full (5,000 nodes, 100,000 pods, 10,000 Services; an hour or
# more here) or SIZE=ci (100 nodes, 1,000 pods: .ci/run's smoke run).
# Needs root, make k8s and make kwok; run alone (it brings up a lab).
bench-scale: build
	hack/bench-scale.sh

# bench-pods: 100 pods created at once on one lab node, then deleted:
# create -> all Ready and delete -> all gone, with the network's share
# (the lab runtime's own CNI ADD/DEL timings), for the flatnet conflist,
# the classic one, and the classic one with the reference plugins
# (docs/benchmarks.md, "Burst start-up in the lab"; PODS, RUNS, SETS,
# JSON: see the script). Needs root and make k8s; run alone (it brings up
# a lab).
bench-pods: build
	hack/bench-pods.sh

# bench-policy: NetworkPolicy enforcement, flatnet's against
# kube-network-policies v0.8.0 (built from the Go module proxy into a cache
# outside git by hack/build-knp.sh), on one lab of 500 pods and 1,000
# policies, same run (docs/benchmarks.md, NetworkPolicy). Needs root and
# make k8s; run alone (it brings up a lab).
bench-policy: build
	hack/bench-policy.sh

# bench-gateway: flatnet's gateway data plane against nginx (Debian) as the
# equivalent reverse proxy, each alone on one core, to the same backends:
# requests/s and p99 with keep-alive and with a new connection per request,
# resident memory at 10,000 routes, the data plane's route change -> served
# (hack/bench-gateway.sh; docs/benchmarks.md, "Gateway").
bench-gateway:
	hack/bench-gateway.sh

# conformance: Kubernetes' sig-network e2e suite (e2e.test v1.37.2) on a
# lab of its own, in phases (Conformance, NetworkPolicy, the other Services/
# DNS/Networking specs), minus test/conformance/skip.txt; JUnit and a
# summary per phase into docs/conformance/, lab down at the end
# (docs/conformance.md). RUNTIME, NODES, PROCS, PHASES, FOCUS, SKIP as
# hack/conformance.sh says. Needs root; builds e2e.test the first time.
conformance:
	hack/conformance.sh

# conformance-gateway: the Gateway API conformance suite (sigs.k8s.io/
# gateway-api v1.6.3, test/gateway), GatewayClass flatnet, profile
# GATEWAY-HTTP, on a containerd lab with an external host, run from that
# host's netns; summary.md and report.yaml into docs/conformance/gateway/
# (docs/conformance.md). FOCUS=<one test> to iterate. Needs root.
conformance-gateway:
	PHASES=gateway RUNTIME=containerd hack/conformance.sh

clean:
	rm -rf bin
