// Package controlplane runs a lab's Kubernetes control plane: the upstream
// etcd and kube-apiserver programs (built by `make k8s`), and with
// Config.Controllers kube-controller-manager and kube-scheduler, as
// detached daemons through internal/proc, with a PKI made in Go and
// kubeconfigs. Everything lives in the lab's state directory (0700):
//
//	<state>/pki/                 the lab CA, apiserver serving cert, client certs (admin, controller
//	                             manager, scheduler, apiserver→kubelet), service-account keys;
//	                             the etcd CA, etcd's serving/peer cert, the apiserver's etcd client cert
//	<state>/etcd/                etcd's data
//	<state>/controlplane.json    the address, service CIDR and ports in use
//	<state>/admin.kubeconfig     client cert O=system:masters, server https://<addr>:<port>
//	<state>/kube-controller-manager.kubeconfig, <state>/kube-scheduler.kubeconfig
//	<state>/pids, <state>/logs   one per process (see internal/proc)
//
// Up is idempotent: a control plane that runs and answers /readyz is reused
// and no file is rewritten; a missing piece is started again with the ports
// recorded before. Down stops the scheduler and the controller manager,
// then kube-apiserver, then etcd (the other way round the apiserver spends
// minutes retrying etcd before it exits), and removes nothing but the
// processes and their pid files.
//
// The controller manager and the scheduler serve their /healthz on
// 127.0.0.1 only, on ports picked like etcd's, so that two labs never
// collide and nothing listens on the machine's other addresses.
//
// Who can do what: the lab runs pods as root processes on the host, so
// whoever can write a Pod is root on the machine. etcd therefore serves
// TLS on 127.0.0.1 and accepts only clients with a certificate of its own
// CA (the apiserver's), on its client and its peer port; the apiserver
// accepts the lab CA's client certificates (the admin kubeconfig) and
// service-account tokens, and authorizes with RBAC. The keys are readable
// by root only. A control plane whose processes run with other flags than
// Up would give them (a lab started before etcd required certificates
// serves plain HTTP) is restarted by Up, keeping etcd's data.
package controlplane

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/netip"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"

	"github.com/flatnet/flatnet/internal/httpserver"
	"github.com/flatnet/flatnet/internal/proc"
)

// Process names, as used for pid and log files.
const (
	EtcdName              = "etcd"
	APIServerName         = "kube-apiserver"
	ControllerManagerName = "kube-controller-manager"
	SchedulerName         = "kube-scheduler"
)

const (
	// DefaultServiceCIDR is the lab's service range.
	DefaultServiceCIDR = "10.96.0.0/16"
	// DefaultPort is the apiserver's port when it is free on Addr.
	DefaultPort = 6443
	// DefaultReadyTimeout bounds the wait for etcd and for /readyz.
	DefaultReadyTimeout = 60 * time.Second
	// ServiceAccountIssuer is the issuer of service-account tokens.
	ServiceAccountIssuer = "https://kubernetes.default.svc.cluster.local"

	stopGrace = 15 * time.Second
)

// Config describes a lab's control plane.
type Config struct {
	// StateDir is the lab's state directory (absolute).
	StateDir string
	// BinDir holds kube-apiserver and etcd; empty means BinDir().
	BinDir string
	// Addr is where kube-apiserver listens and what it advertises (the
	// underlay's host address). On a loopback address the endpoint
	// reconciler is off, since the apiserver refuses to advertise one.
	Addr netip.Addr
	// ServiceCIDR is the service cluster IP range; empty means
	// DefaultServiceCIDR.
	ServiceCIDR string
	// Port is the apiserver's port; 0 means DefaultPort if it is free on
	// Addr, else any free port. Once recorded, the port is kept.
	Port int
	// Name names the cluster, user and context in the kubeconfig; empty
	// means the state directory's base name.
	Name string
	// ReadyTimeout bounds each readiness wait; 0 means DefaultReadyTimeout.
	ReadyTimeout time.Duration
	// Controllers also runs kube-controller-manager and kube-scheduler.
	// Without them nothing makes service accounts, so the ServiceAccount
	// admission plugin is off then.
	Controllers bool
	// DisabledControllers are left out of kube-controller-manager's
	// --controllers (e.g. "endpointslice-controller" where flatnet's own
	// EndpointSlice controller runs).
	DisabledControllers []string
	// NodeMonitorGracePeriod is kube-controller-manager's
	// --node-monitor-grace-period (0: its default): how long a node may
	// go without a heartbeat before it is marked Unknown and its pods not
	// ready. Simulated nodes renew no lease and heartbeat rarely.
	NodeMonitorGracePeriod time.Duration
	// ManyNodes sizes the control plane for thousands of nodes and tens
	// of thousands of pods: kube-apiserver's in-flight limits raised and
	// etcd's space quota at 8 GiB (apiserverArgs, etcdArgs).
	ManyNodes bool
}

// Info tells how to reach a running control plane.
type Info struct {
	Kubeconfig   string // <state>/admin.kubeconfig
	Server       string // https://<addr>:<port>
	APIServerPID int
	EtcdPID      int
	// Reused is true when both were already running and ready.
	Reused bool
}

// record is <state>/controlplane.json.
type record struct {
	Addr           string `json:"addr"`
	ServiceCIDR    string `json:"serviceCIDR"`
	APIServerPort  int    `json:"apiserverPort"`
	EtcdClientPort int    `json:"etcdClientPort"`
	EtcdPeerPort   int    `json:"etcdPeerPort"`
	// Controllers: kube-controller-manager and kube-scheduler run too, on
	// these 127.0.0.1 ports, with these controllers left out.
	Controllers           bool     `json:"controllers,omitempty"`
	DisabledControllers   []string `json:"disabledControllers,omitempty"`
	ControllerManagerPort int      `json:"controllerManagerPort,omitempty"`
	SchedulerPort         int      `json:"schedulerPort,omitempty"`
	// NodeMonitorGracePeriod and ManyNodes are Config's.
	NodeMonitorGracePeriod string `json:"nodeMonitorGracePeriod,omitempty"`
	ManyNodes              bool   `json:"manyNodes,omitempty"`
}

func recordPath(stateDir string) string { return filepath.Join(stateDir, "controlplane.json") }

// KubeconfigPath is where Up writes the admin kubeconfig.
func KubeconfigPath(stateDir string) string { return filepath.Join(stateDir, "admin.kubeconfig") }

func (r record) server() string {
	return "https://" + netip.AddrPortFrom(netip.MustParseAddr(r.Addr), uint16(r.APIServerPort)).String()
}

func (r record) etcdClientURL() string { return "https://127.0.0.1:" + strconv.Itoa(r.EtcdClientPort) }
func (r record) etcdPeerURL() string   { return "https://127.0.0.1:" + strconv.Itoa(r.EtcdPeerPort) }

// etcdArgs is etcd's command line: TLS on both ports, and only clients
// (and peers) with a certificate of the etcd CA.
func etcdArgs(binDir, stateDir string, p PKI, r record) []string {
	args := []string{
		filepath.Join(binDir, "etcd"),
		"--name=lab",
		"--data-dir=" + filepath.Join(stateDir, "etcd"),
		"--listen-client-urls=" + r.etcdClientURL(),
		"--advertise-client-urls=" + r.etcdClientURL(),
		"--listen-peer-urls=" + r.etcdPeerURL(),
		"--initial-advertise-peer-urls=" + r.etcdPeerURL(),
		"--initial-cluster=lab=" + r.etcdPeerURL(),
		"--cert-file=" + p.EtcdServerCert(),
		"--key-file=" + p.EtcdServerKey(),
		"--trusted-ca-file=" + p.EtcdCACert(),
		"--client-cert-auth",
		// One member: nobody has a reason to use the peer port, but etcd
		// listens on it anyway, so it asks for the same certificates.
		"--peer-cert-file=" + p.EtcdServerCert(),
		"--peer-key-file=" + p.EtcdServerKey(),
		"--peer-trusted-ca-file=" + p.EtcdCACert(),
		"--peer-client-cert-auth",
		// One member, on loopback: a short election timeout only shortens
		// the wait for the first leader (0.9 s -> 0.2 s), no peer can miss
		// a heartbeat.
		"--heartbeat-interval=20",
		"--election-timeout=200",
	}
	if r.ManyNodes {
		// 5,000 nodes and 50,000 pods took 550 MB on disk
		// (docs/research/scale.md); the 2 GiB default quota leaves little
		// room for history between compactions. A limit, not an
		// allocation.
		args = append(args, "--quota-backend-bytes="+strconv.FormatInt(etcdQuotaManyNodes, 10))
	}
	return args
}

// etcdQuotaManyNodes is etcd's --quota-backend-bytes with ManyNodes: 8 GiB.
const etcdQuotaManyNodes = 8 << 30

// In-flight limits with ManyNodes. With API priority and fairness (on by
// default) their sum is the apiserver's total concurrency, shared out
// among priority levels (defaults 400 and 200). The lab's admin clients
// are exempt anyway; the controller manager and the scheduler are not,
// and list and patch thousands of nodes.
const (
	maxRequestsInflightManyNodes         = 1600
	maxMutatingRequestsInflightManyNodes = 800
)

// apiserverArgs is kube-apiserver's command line.
func apiserverArgs(binDir, stateDir string, p PKI, r record) []string {
	addr := netip.MustParseAddr(r.Addr)
	reconciler := "lease"
	if addr.IsLoopback() {
		reconciler = "none"
	}
	args := []string{
		filepath.Join(binDir, "kube-apiserver"),
		"--etcd-servers=" + r.etcdClientURL(),
		"--etcd-cafile=" + p.EtcdCACert(),
		"--etcd-certfile=" + p.EtcdClientCert(),
		"--etcd-keyfile=" + p.EtcdClientKey(),
		"--bind-address=" + r.Addr,
		"--advertise-address=" + r.Addr,
		"--secure-port=" + strconv.Itoa(r.APIServerPort),
		"--tls-cert-file=" + p.APIServerCert(),
		"--tls-private-key-file=" + p.APIServerKey(),
		"--client-ca-file=" + p.CACert(),
		"--service-cluster-ip-range=" + r.ServiceCIDR,
		"--service-account-issuer=" + ServiceAccountIssuer,
		"--service-account-key-file=" + p.ServiceAccountPub(),
		"--service-account-signing-key-file=" + p.ServiceAccountKey(),
		"--authorization-mode=Node,RBAC",
		// deploy/'s DaemonSet is privileged; dry-run=server must accept it.
		"--allow-privileged=true",
		"--endpoint-reconciler-type=" + reconciler,
		"--cert-dir=" + filepath.Join(p.Dir, "apiserver-generated"),
		"--profiling=false",
		// exec, logs, port-forward and pods/proxy through kubelets: by
		// InternalIP (lab nodes' names resolve nowhere).
		"--kubelet-client-certificate=" + p.KubeletClientCert(),
		"--kubelet-client-key=" + p.KubeletClientKey(),
		"--kubelet-preferred-address-types=InternalIP,Hostname",
	}
	if !r.Controllers {
		// No kube-controller-manager makes the default service accounts,
		// and no node lifecycle controller would ever lift the
		// node.kubernetes.io/not-ready taint TaintNodesByCondition puts on
		// new Nodes.
		args = append(args, "--disable-admission-plugins=ServiceAccount,TaintNodesByCondition")
	}
	if r.ManyNodes {
		args = append(args,
			"--max-requests-inflight="+strconv.Itoa(maxRequestsInflightManyNodes),
			"--max-mutating-requests-inflight="+strconv.Itoa(maxMutatingRequestsInflightManyNodes))
	}
	return args
}

// controllerManagerArgs is kube-controller-manager's command line: every
// default controller but the disabled ones, service-account tokens signed
// with the apiserver's key, CSRs signed by the lab CA, one instance (no
// leader election), /healthz on 127.0.0.1.
func controllerManagerArgs(binDir, stateDir string, p PKI, r record) []string {
	controllers := "*"
	for _, c := range r.DisabledControllers {
		controllers += ",-" + c
	}
	args := append(componentArgs(binDir, stateDir, p, ControllerManagerName, r.ControllerManagerPort),
		"--controllers="+controllers,
		"--use-service-account-credentials=true",
		"--service-account-private-key-file="+p.ServiceAccountKey(),
		"--root-ca-file="+p.CACert(),
		"--cluster-signing-cert-file="+p.CACert(),
		"--cluster-signing-key-file="+p.CAKey(),
	)
	if r.NodeMonitorGracePeriod != "" {
		args = append(args, "--node-monitor-grace-period="+r.NodeMonitorGracePeriod)
	}
	if r.ManyNodes {
		// Its node lifecycle controller takes the not-ready taint off
		// every new Node once Ready, a GET and a PATCH each: at the
		// default 20 QPS, 5,000 Nodes keep it (and every Node watcher)
		// busy for eight minutes. ClusterLoader2's 5,000-node runs give
		// it 100 QPS too.
		args = append(args, "--kube-api-qps="+strconv.Itoa(kcmQPSManyNodes), "--kube-api-burst="+strconv.Itoa(2*kcmQPSManyNodes))
	}
	return args
}

// kcmQPSManyNodes is kube-controller-manager's --kube-api-qps with
// ManyNodes (burst twice that).
const kcmQPSManyNodes = 100

// schedulerArgs is kube-scheduler's command line.
func schedulerArgs(binDir, stateDir string, p PKI, r record) []string {
	return componentArgs(binDir, stateDir, p, SchedulerName, r.SchedulerPort)
}

// componentArgs are the flags kube-controller-manager and kube-scheduler
// share: their kubeconfig (also to check callers' tokens), /healthz on
// 127.0.0.1:port, one instance.
func componentArgs(binDir, stateDir string, p PKI, name string, port int) []string {
	kc := componentKubeconfig(stateDir, name)
	return []string{
		filepath.Join(binDir, name),
		"--kubeconfig=" + kc,
		"--authentication-kubeconfig=" + kc,
		"--authorization-kubeconfig=" + kc,
		"--bind-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(port),
		"--cert-dir=" + filepath.Join(p.Dir, strings.TrimPrefix(name, "kube-")+"-generated"),
		"--leader-elect=false",
		"--profiling=false",
	}
}

// componentKubeconfig is the kubeconfig file of kube-controller-manager or
// kube-scheduler.
func componentKubeconfig(stateDir, name string) string {
	return filepath.Join(stateDir, name+".kubeconfig")
}

// Up brings the control plane up, or finds it up, and returns how to reach
// it. Progress lines go to log (may be nil).
//
// A failed Up stops whatever it started itself (it leaves processes that
// were already running alone).
func Up(ctx context.Context, cfg Config, log io.Writer) (info *Info, err error) {
	if log == nil {
		log = io.Discard
	}
	cfg, err = withDefaults(cfg)
	if err != nil {
		return nil, err
	}
	if err := privateDir(cfg.StateDir); err != nil {
		return nil, fmt.Errorf("control plane: %w", err)
	}
	unlock, err := lock(cfg.StateDir)
	if err != nil {
		return nil, err
	}
	defer unlock()

	prev, err := loadRecord(cfg.StateDir)
	if err != nil {
		return nil, err
	}
	if prev != nil && (prev.Addr != cfg.Addr.String() || prev.ServiceCIDR != cfg.ServiceCIDR) {
		return nil, fmt.Errorf("control plane in %s was made for address %s and service CIDR %s, not %s and %s: take the lab down (which removes its state) to change them",
			cfg.StateDir, prev.Addr, prev.ServiceCIDR, cfg.Addr, cfg.ServiceCIDR)
	}
	if prev != nil && cfg.Port != 0 && prev.APIServerPort != cfg.Port {
		return nil, fmt.Errorf("control plane in %s uses apiserver port %d, not %d: take the lab down to change it", cfg.StateDir, prev.APIServerPort, cfg.Port)
	}

	pki := PKI{Dir: PKIDir(cfg.StateDir)}
	serviceIP, err := firstServiceIP(cfg.ServiceCIDR)
	if err != nil {
		return nil, err
	}
	pkiChanged, err := ensurePKI(pki, apiserverNames(cfg.Addr, serviceIP), time.Now())
	if err != nil {
		return nil, fmt.Errorf("control plane certificates in %s: %w", pki.Dir, err)
	}

	prev = prev.want(cfg)
	etcdPID, etcdUp := proc.Running(cfg.StateDir, EtcdName)
	apiPID, apiUp := proc.Running(cfg.StateDir, APIServerName)
	// What runs with old certificates or flags is restarted, the
	// controllers and the apiserver first (without etcd it would hang); an
	// apiserver without its etcd too.
	etcdWhy, apiWhy := "", ""
	if etcdUp {
		etcdWhy = staleEtcd(cfg.StateDir, pki, prev, etcdPID, pkiChanged)
	}
	if apiUp {
		apiWhy = staleAPIServer(cfg.StateDir, pki, prev, apiPID, pkiChanged, etcdUp && etcdWhy == "")
	}
	compUp := map[string]bool{}
	for _, c := range components {
		pid, up := proc.Running(cfg.StateDir, c.name)
		if !up {
			continue
		}
		why := c.stale(cfg.StateDir, pki, prev, pid, pkiChanged)
		switch {
		case why != "":
		case apiWhy != "":
			why = "kube-apiserver restarts"
		case !apiUp:
			// It ran on without the apiserver. Its caches are as old as
			// the outage, and the node lifecycle controller's last-seen
			// times too: on its first pass after the apiserver returns it
			// may mark every node unknown and its pods not ready before
			// a heartbeat lands, and Services lose their endpoints for a
			// moment. A real one would have lost its leader lease and
			// restarted; the lab (no leader election, no supervisor)
			// restarts it with the apiserver.
			why = "it ran without kube-apiserver, which was down"
		}
		if why == "" {
			compUp[c.name] = true
			continue
		}
		fmt.Fprintf(log, "control plane: stopping %s (pid %d): %s\n", c.name, pid, why)
		if err := proc.Stop(cfg.StateDir, c.name, stopGrace); err != nil {
			return nil, fmt.Errorf("control plane: %w", err)
		}
	}
	if apiWhy != "" {
		fmt.Fprintf(log, "control plane: restarting kube-apiserver (pid %d): %s\n", apiPID, apiWhy)
		if err := proc.Stop(cfg.StateDir, APIServerName, apiserverGrace(etcdUp)); err != nil {
			return nil, fmt.Errorf("control plane: %w", err)
		}
		apiUp = false
	}
	if etcdWhy != "" {
		fmt.Fprintf(log, "control plane: restarting etcd (pid %d): %s\n", etcdPID, etcdWhy)
		if err := proc.Stop(cfg.StateDir, EtcdName, stopGrace); err != nil {
			return nil, fmt.Errorf("control plane: %w", err)
		}
		etcdUp = false
	}

	rec, err := choosePorts(cfg, prev, etcdUp, apiUp, log)
	if err != nil {
		return nil, err
	}
	if err := chooseComponentPorts(&rec, compUp); err != nil {
		return nil, err
	}
	if err := writeJSON(recordPath(cfg.StateDir), rec); err != nil {
		return nil, fmt.Errorf("control plane: %w", err)
	}
	tc, err := clientTLS(pki.CACert(), pki.AdminCert(), pki.AdminKey())
	if err != nil {
		return nil, fmt.Errorf("control plane: %w", err)
	}
	etcdTC, err := clientTLS(pki.EtcdCACert(), pki.EtcdClientCert(), pki.EtcdClientKey())
	if err != nil {
		return nil, fmt.Errorf("control plane: %w", err)
	}
	reused := etcdUp && apiUp && (!cfg.Controllers || len(compUp) == len(components))

	var started []string
	defer func() {
		if err == nil {
			return
		}
		// Undo in reverse: the apiserver before etcd.
		for i := len(started) - 1; i >= 0; i-- {
			if serr := proc.Stop(cfg.StateDir, started[i], stopGrace); serr != nil {
				err = errors.Join(err, serr)
			}
		}
	}()

	if !etcdUp {
		if err := os.MkdirAll(filepath.Join(cfg.StateDir, "etcd"), 0o700); err != nil {
			return nil, fmt.Errorf("control plane: %w", err)
		}
		t0 := time.Now()
		etcdPID, err = proc.Start(EtcdName, etcdArgs(cfg.BinDir, cfg.StateDir, pki, rec), nil, cfg.StateDir, "")
		if err != nil {
			return nil, fmt.Errorf("control plane: %w", err)
		}
		started = append(started, EtcdName)
		if err := waitReady(ctx, cfg, EtcdName, cfg.ReadyTimeout, func(c context.Context) error { return etcdHealthy(c, rec, etcdTC) }); err != nil {
			return nil, err
		}
		fmt.Fprintf(log, "control plane: etcd ready in %.1fs (pid %d, %s)\n", time.Since(t0).Seconds(), etcdPID, rec.etcdClientURL())
	}
	if !apiUp {
		t0 := time.Now()
		apiPID, err = proc.Start(APIServerName, apiserverArgs(cfg.BinDir, cfg.StateDir, pki, rec), nil, cfg.StateDir, "")
		if err != nil {
			return nil, fmt.Errorf("control plane: %w", err)
		}
		started = append(started, APIServerName)
		if err := waitReady(ctx, cfg, APIServerName, cfg.ReadyTimeout, func(c context.Context) error { return apiserverReady(c, rec, tc) }); err != nil {
			return nil, err
		}
		fmt.Fprintf(log, "control plane: kube-apiserver ready in %.1fs (pid %d, %s)\n", time.Since(t0).Seconds(), apiPID, rec.server())
	} else if err := waitReady(ctx, cfg, APIServerName, cfg.ReadyTimeout, func(c context.Context) error { return apiserverReady(c, rec, tc) }); err != nil {
		return nil, err
	}
	if reused {
		fmt.Fprintf(log, "control plane: already running (etcd pid %d, kube-apiserver pid %d, %s)\n", etcdPID, apiPID, rec.server())
	}

	kc := KubeconfigPath(cfg.StateDir)
	data, err := kubeconfig(cfg.Name, rec.server(), pki)
	if err != nil {
		return nil, fmt.Errorf("control plane: admin kubeconfig: %w", err)
	}
	if err := writeFile(kc, data, 0o600); err != nil {
		return nil, fmt.Errorf("control plane: %w", err)
	}
	if cfg.Controllers {
		for _, c := range components {
			if compUp[c.name] {
				continue
			}
			data, err := kubeconfigFor(cfg.Name, rec.server(), pki, c.user, c.cert(pki), c.key(pki))
			if err != nil {
				return nil, fmt.Errorf("control plane: %s kubeconfig: %w", c.name, err)
			}
			if err := writeFile(componentKubeconfig(cfg.StateDir, c.name), data, 0o600); err != nil {
				return nil, fmt.Errorf("control plane: %w", err)
			}
			t0 := time.Now()
			pid, err := proc.Start(c.name, c.args(cfg.BinDir, cfg.StateDir, pki, rec), nil, cfg.StateDir, "")
			if err != nil {
				return nil, fmt.Errorf("control plane: %w", err)
			}
			started = append(started, c.name)
			port := c.port(rec)
			if err := waitReady(ctx, cfg, c.name, cfg.ReadyTimeout, func(ctx context.Context) error { return healthz(ctx, port) }); err != nil {
				return nil, err
			}
			fmt.Fprintf(log, "control plane: %s ready in %.1fs (pid %d)\n", c.name, time.Since(t0).Seconds(), pid)
		}
	} else {
		// A lab that ran them before and wants them no more.
		for _, c := range components {
			if err := proc.Stop(cfg.StateDir, c.name, stopGrace); err != nil {
				return nil, fmt.Errorf("control plane: %w", err)
			}
		}
	}
	return &Info{Kubeconfig: kc, Server: rec.server(), APIServerPID: apiPID, EtcdPID: etcdPID, Reused: reused}, nil
}

// component is a control-plane process that runs beside the apiserver
// and talks only to it: kube-controller-manager and kube-scheduler.
type component struct {
	name, user string
	cert, key  func(PKI) string
	args       func(binDir, stateDir string, p PKI, r record) []string
	port       func(record) int
}

// components, in start order (Down stops them in reverse).
var components = []component{
	{ControllerManagerName, ControllerManagerUser, PKI.ControllerManagerCert, PKI.ControllerManagerKey, controllerManagerArgs,
		func(r record) int { return r.ControllerManagerPort }},
	{SchedulerName, SchedulerUser, PKI.SchedulerCert, PKI.SchedulerKey, schedulerArgs,
		func(r record) int { return r.SchedulerPort }},
}

// stale tells why the running component (pid) must be restarted, or "".
func (c component) stale(stateDir string, pki PKI, want *record, pid int, pkiChanged []string) string {
	switch {
	case want == nil || !want.Controllers:
		return "the control plane runs without it now"
	case slices.Contains(pkiChanged, pki.CACert()) || slices.Contains(pkiChanged, c.cert(pki)) || slices.Contains(pkiChanged, pki.ServiceAccountKey()):
		return "certificates changed"
	case c.port(*want) == 0 || !sameFlags(pid, c.args("", stateDir, pki, *want)):
		return "its flags changed"
	}
	return ""
}

// want is the record Up aims for: r's ports with cfg's choice of
// controllers (nil stays nil).
func (r *record) want(cfg Config) *record {
	if r == nil {
		return nil
	}
	w := *r
	w.Controllers = cfg.Controllers
	w.DisabledControllers = slices.Clone(cfg.DisabledControllers)
	if !cfg.Controllers {
		w.DisabledControllers = nil
	}
	w.NodeMonitorGracePeriod, w.ManyNodes = cfg.gracePeriod(), cfg.ManyNodes
	return &w
}

// gracePeriod is the record's NodeMonitorGracePeriod ("" for the default).
func (cfg Config) gracePeriod() string {
	if cfg.NodeMonitorGracePeriod <= 0 {
		return ""
	}
	return cfg.NodeMonitorGracePeriod.String()
}

// chooseComponentPorts keeps the recorded ports of the components that
// run and picks free 127.0.0.1 ports for the others.
func chooseComponentPorts(r *record, up map[string]bool) error {
	if !r.Controllers {
		r.ControllerManagerPort, r.SchedulerPort = 0, 0
		return nil
	}
	loop := netip.MustParseAddr("127.0.0.1")
	for _, p := range []struct {
		name string
		port *int
	}{{ControllerManagerName, &r.ControllerManagerPort}, {SchedulerName, &r.SchedulerPort}} {
		if up[p.name] || (*p.port != 0 && portFree(loop, *p.port)) {
			continue
		}
		ports, err := freePorts(loop, 1)
		if err != nil {
			return fmt.Errorf("control plane: picking a port for %s: %w", p.name, err)
		}
		*p.port = ports[0]
	}
	return nil
}

// healthz asks a component's /healthz on 127.0.0.1 (its self-signed
// serving certificate is not checked: loopback, and only "ok" is read).
func healthz(ctx context.Context, port int) error {
	return getOK(ctx, &tls.Config{InsecureSkipVerify: true}, "https://127.0.0.1:"+strconv.Itoa(port)+"/healthz") //nolint:gosec // loopback health probe
}

// Down stops kube-scheduler, kube-controller-manager, kube-apiserver, then
// etcd. Processes that are not running are skipped; nothing but their pid
// files is removed.
func Down(stateDir string) error {
	if _, err := os.Stat(stateDir); errors.Is(err, os.ErrNotExist) {
		return nil
	}
	unlock, err := lock(stateDir)
	if err != nil {
		return err
	}
	defer unlock()
	for i := len(components) - 1; i >= 0; i-- {
		if err := proc.Stop(stateDir, components[i].name, stopGrace); err != nil {
			return fmt.Errorf("control plane down: %w", err)
		}
	}
	_, etcdUp := proc.Running(stateDir, EtcdName)
	if err := proc.Stop(stateDir, APIServerName, apiserverGrace(etcdUp)); err != nil {
		// Stopping etcd under a live apiserver would hang it: stop here.
		return fmt.Errorf("control plane down: %w", err)
	}
	if err := proc.Stop(stateDir, EtcdName, stopGrace); err != nil {
		return fmt.Errorf("control plane down: %w", err)
	}
	return nil
}

// apiserverGrace is how long a stopping kube-apiserver gets before
// SIGKILL. Without etcd it would spend minutes retrying storage on its way
// out, and it keeps no state of its own, so it gets little time then.
func apiserverGrace(etcdUp bool) time.Duration {
	if etcdUp {
		return stopGrace
	}
	return 2 * time.Second
}

// Current reports whether every process cfg asks for runs with the
// command line Up would start it with (it does not ask /readyz). A lab
// started before etcd required client certificates, or before the
// controllers ran, is not current: `lab up` then runs Up, which restarts
// or adds what differs.
func Current(cfg Config) bool {
	if _, _, ok := Running(cfg.StateDir); !ok || Outdated(cfg) != "" {
		return false
	}
	for _, c := range components {
		if _, up := proc.Running(cfg.StateDir, c.name); up != cfg.Controllers {
			return false
		}
	}
	return true
}

// Outdated tells why Up(cfg) would restart the running control plane (etcd
// on plain HTTP, other flags), or "" when what runs is current or nothing
// runs.
func Outdated(cfg Config) string {
	prev, err := loadRecord(cfg.StateDir)
	if err != nil {
		prev = nil
	}
	prev = prev.want(cfg)
	pki := PKI{Dir: PKIDir(cfg.StateDir)}
	if pid, ok := proc.Running(cfg.StateDir, EtcdName); ok {
		if why := staleEtcd(cfg.StateDir, pki, prev, pid, nil); why != "" {
			return "etcd: " + why
		}
	}
	if pid, ok := proc.Running(cfg.StateDir, APIServerName); ok {
		if why := staleAPIServer(cfg.StateDir, pki, prev, pid, nil, true); why != "" {
			return "kube-apiserver: " + why
		}
	}
	for _, c := range components {
		if pid, ok := proc.Running(cfg.StateDir, c.name); ok {
			if why := c.stale(cfg.StateDir, pki, prev, pid, nil); why != "" {
				return c.name + ": " + why
			}
		}
	}
	return ""
}

// staleEtcd tells why the running etcd (pid) must be restarted, or "".
func staleEtcd(stateDir string, pki PKI, prev *record, pid int, pkiChanged []string) string {
	switch {
	case prev == nil:
		return "no record of its ports"
	case !hasArg(pid, "--client-cert-auth"):
		return "it serves plain HTTP to anyone on this machine (a lab from before etcd required client certificates); it is restarted with TLS and keeps its data"
	case slices.ContainsFunc(pki.etcdFiles(), func(f string) bool { return slices.Contains(pkiChanged, f) }):
		return "certificates changed"
	case !sameFlags(pid, etcdArgs("", stateDir, pki, *prev)):
		return "its flags changed"
	}
	return ""
}

// staleAPIServer tells why the running kube-apiserver (pid) must be
// restarted, or "". Any new certificate is a reason: it reads most of them.
func staleAPIServer(stateDir string, pki PKI, prev *record, pid int, pkiChanged []string, etcdOK bool) string {
	switch {
	case !etcdOK:
		return "etcd is not running, or restarts"
	case prev == nil:
		return "no record of its ports"
	case len(pkiChanged) > 0:
		return "certificates changed"
	case !sameFlags(pid, apiserverArgs("", stateDir, pki, *prev)):
		return "its flags changed"
	}
	return ""
}

// sameFlags reports whether process pid runs with want's arguments. The
// program's path is not compared: a new k8s bin dir alone restarts
// nothing.
func sameFlags(pid int, want []string) bool {
	argv, err := cmdline(pid)
	return err == nil && len(argv) > 0 && slices.Equal(argv[1:], want[1:])
}

func hasArg(pid int, arg string) bool {
	argv, err := cmdline(pid)
	return err == nil && slices.Contains(argv, arg)
}

func cmdline(pid int) ([]string, error) {
	b, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "cmdline"))
	if err != nil {
		return nil, err
	}
	return strings.Split(strings.TrimSuffix(string(b), "\x00"), "\x00"), nil
}

// Running reports whether both control-plane processes run (it does not
// ask /readyz).
func Running(stateDir string) (apiserverPID, etcdPID int, ok bool) {
	a, aok := proc.Running(stateDir, APIServerName)
	e, eok := proc.Running(stateDir, EtcdName)
	return a, e, aok && eok
}

func withDefaults(cfg Config) (Config, error) {
	if cfg.StateDir == "" || !filepath.IsAbs(cfg.StateDir) {
		return cfg, fmt.Errorf("control plane: state dir %q must be an absolute path", cfg.StateDir)
	}
	if !cfg.Addr.IsValid() || cfg.Addr.IsUnspecified() {
		return cfg, fmt.Errorf("control plane: apiserver address %q must be a specific IP address", cfg.Addr)
	}
	cfg.Addr = cfg.Addr.Unmap()
	if cfg.ServiceCIDR == "" {
		cfg.ServiceCIDR = DefaultServiceCIDR
	}
	p, err := netip.ParsePrefix(cfg.ServiceCIDR)
	if err != nil {
		return cfg, fmt.Errorf("control plane: service CIDR %q: %w", cfg.ServiceCIDR, err)
	}
	cfg.ServiceCIDR = p.Masked().String()
	if cfg.Port < 0 || cfg.Port > 65535 {
		return cfg, fmt.Errorf("control plane: apiserver port %d out of range", cfg.Port)
	}
	if cfg.Name == "" {
		cfg.Name = filepath.Base(cfg.StateDir)
	}
	if cfg.ReadyTimeout == 0 {
		cfg.ReadyTimeout = DefaultReadyTimeout
	}
	if cfg.BinDir == "" {
		d, err := BinDir()
		if err != nil {
			return cfg, err
		}
		cfg.BinDir = d
	}
	bins := []string{"etcd", "kube-apiserver"}
	if cfg.Controllers {
		bins = append(bins, ControllerManagerName, SchedulerName)
	}
	if err := checkBins(cfg.BinDir, bins...); err != nil {
		return cfg, err
	}
	return cfg, nil
}

// firstServiceIP is the kubernetes service's ClusterIP: the range's first
// address after the network address, as the apiserver picks it.
func firstServiceIP(cidr string) (netip.Addr, error) {
	p, err := netip.ParsePrefix(cidr)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("control plane: service CIDR %q: %w", cidr, err)
	}
	ip := p.Masked().Addr().Next()
	if !p.Contains(ip) {
		return netip.Addr{}, fmt.Errorf("control plane: service CIDR %q is too small", cidr)
	}
	return ip, nil
}

// choosePorts keeps the recorded ports where it can: a running process's
// always, a stopped one's while the port is still free. New ports are
// taken from the kernel (etcd on 127.0.0.1) or DefaultPort (apiserver).
func choosePorts(cfg Config, prev *record, etcdUp, apiUp bool, log io.Writer) (record, error) {
	r := record{Addr: cfg.Addr.String(), ServiceCIDR: cfg.ServiceCIDR}
	if prev != nil {
		r = *prev
	}
	r.Controllers = cfg.Controllers
	r.DisabledControllers = nil
	if cfg.Controllers {
		r.DisabledControllers = slices.Clone(cfg.DisabledControllers)
	}
	r.NodeMonitorGracePeriod, r.ManyNodes = cfg.gracePeriod(), cfg.ManyNodes
	loop := netip.MustParseAddr("127.0.0.1")
	if !etcdUp {
		if r.EtcdClientPort == 0 || !portFree(loop, r.EtcdClientPort) || !portFree(loop, r.EtcdPeerPort) {
			ports, err := freePorts(loop, 2)
			if err != nil {
				return r, fmt.Errorf("control plane: picking etcd ports: %w", err)
			}
			if r.EtcdClientPort != 0 {
				fmt.Fprintf(log, "control plane: etcd's ports %d/%d are taken; using %d/%d\n", r.EtcdClientPort, r.EtcdPeerPort, ports[0], ports[1])
			}
			r.EtcdClientPort, r.EtcdPeerPort = ports[0], ports[1]
		}
	}
	if !apiUp {
		want := r.APIServerPort
		if want == 0 {
			want = cfg.Port
		}
		switch {
		case want != 0 && portFree(cfg.Addr, want):
			r.APIServerPort = want
		case cfg.Port != 0:
			return r, fmt.Errorf("control plane: apiserver port %s is in use", netip.AddrPortFrom(cfg.Addr, uint16(cfg.Port)))
		case r.APIServerPort == 0 && portFree(cfg.Addr, DefaultPort):
			r.APIServerPort = DefaultPort
		default:
			ports, err := freePorts(cfg.Addr, 1)
			if err != nil {
				return r, fmt.Errorf("control plane: picking the apiserver port on %s: %w", cfg.Addr, err)
			}
			if r.APIServerPort != 0 {
				fmt.Fprintf(log, "control plane: apiserver port %d is taken; using %d\n", r.APIServerPort, ports[0])
			}
			r.APIServerPort = ports[0]
		}
	}
	return r, nil
}

func portFree(addr netip.Addr, port int) bool {
	l, err := net.Listen("tcp", netip.AddrPortFrom(addr, uint16(port)).String())
	if err != nil {
		return false
	}
	l.Close()
	return true
}

// freePorts asks the kernel for n distinct free ports on addr.
func freePorts(addr netip.Addr, n int) ([]int, error) {
	var ports []int
	for range n {
		l, err := net.Listen("tcp", netip.AddrPortFrom(addr, 0).String())
		if err != nil {
			return nil, err
		}
		defer l.Close()
		ports = append(ports, l.Addr().(*net.TCPAddr).Port)
	}
	return ports, nil
}

// waitReady polls ready until it succeeds, the process dies, or timeout.
func waitReady(ctx context.Context, cfg Config, name string, timeout time.Duration, ready func(context.Context) error) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	logPath := proc.LogFile(cfg.StateDir, name)
	var last error
	for {
		pctx, pcancel := context.WithTimeout(ctx, 2*time.Second)
		last = ready(pctx)
		pcancel()
		if last == nil {
			return nil
		}
		if _, ok := proc.Running(cfg.StateDir, name); !ok {
			return fmt.Errorf("control plane: %s exited while starting; last lines of %s:\n%s", name, logPath, proc.Tail(logPath, 20))
		}
		select {
		case <-ctx.Done():
			if errors.Is(ctx.Err(), context.DeadlineExceeded) {
				return fmt.Errorf("control plane: %s not ready after %s (last check: %v); last lines of %s:\n%s",
					name, timeout, last, logPath, proc.Tail(logPath, 20))
			}
			return fmt.Errorf("control plane: waiting for %s: %w", name, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

// etcdHealthy asks etcd's /health with the apiserver's client certificate
// (etcd accepts no other).
func etcdHealthy(ctx context.Context, r record, tc *tls.Config) error {
	client := &http.Client{Transport: &http.Transport{TLSClientConfig: tc, DisableKeepAlives: true}}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, r.etcdClientURL()+"/health", nil)
	if err != nil {
		return err
	}
	resp, err := client.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	var h struct {
		Health string `json:"health"`
	}
	if err := json.NewDecoder(io.LimitReader(resp.Body, 4096)).Decode(&h); err != nil {
		return fmt.Errorf("etcd /health: %w", err)
	}
	if resp.StatusCode != http.StatusOK || h.Health != "true" {
		return fmt.Errorf("etcd /health: %s, health=%q", resp.Status, h.Health)
	}
	return nil
}

// clientTLS trusts the CA in caFile and presents the client certificate
// certFile with keyFile.
func clientTLS(caFile, certFile, keyFile string) (*tls.Config, error) {
	caPEM, err := os.ReadFile(caFile)
	if err != nil {
		return nil, err
	}
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("%s: no certificate", caFile)
	}
	cert, err := tls.LoadX509KeyPair(certFile, keyFile)
	if err != nil {
		return nil, err
	}
	return &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12}, nil
}

func apiserverReady(ctx context.Context, r record, tc *tls.Config) error {
	return getOK(ctx, tc, r.server()+"/readyz")
}

// getOK GETs url over TLS with tc and wants 200 OK.
func getOK(ctx context.Context, tc *tls.Config, url string) error {
	return httpserver.CheckOK(ctx, &http.Client{Transport: &http.Transport{TLSClientConfig: tc, DisableKeepAlives: true}}, url)
}

func loadRecord(stateDir string) (*record, error) {
	b, err := os.ReadFile(recordPath(stateDir))
	if errors.Is(err, os.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("control plane: %w", err)
	}
	var r record
	if err := json.Unmarshal(b, &r); err != nil {
		return nil, fmt.Errorf("control plane: %s: %w (remove it, or take the lab down, to start afresh)", recordPath(stateDir), err)
	}
	if _, err := netip.ParseAddr(r.Addr); err != nil || r.APIServerPort <= 0 || r.EtcdClientPort <= 0 || r.EtcdPeerPort <= 0 {
		return nil, fmt.Errorf("control plane: %s is incomplete (remove it, or take the lab down, to start afresh)", recordPath(stateDir))
	}
	return &r, nil
}

func writeJSON(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return err
	}
	return writeFile(path, append(b, '\n'), 0o644)
}

// lock serialises Up and Down on one state directory.
func lock(stateDir string) (func(), error) {
	f, err := os.OpenFile(filepath.Join(stateDir, "controlplane.lock"), os.O_RDWR|os.O_CREATE, 0o644)
	if err != nil {
		return nil, fmt.Errorf("control plane: %w", err)
	}
	if err := unix.Flock(int(f.Fd()), unix.LOCK_EX); err != nil {
		f.Close()
		return nil, fmt.Errorf("control plane: locking %s: %w", f.Name(), err)
	}
	return func() { f.Close() }, nil
}
