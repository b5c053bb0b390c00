package main

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"golang.org/x/sys/unix"
	authv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/tools/clientcmd"

	"github.com/flatnet/flatnet/internal/lab"
	"github.com/flatnet/flatnet/internal/proc"
)

// knpProc is the anchor's daemon name in the lab's state dir: `lab down`
// stops it with the lab's other daemons if the benchmark cannot.
const (
	knpProc  = "bench-kube-network-policies"
	knpTable = "kube-network-policies" // its table, family inet
)

// node runs commands in one lab node's network namespace.
type node struct {
	lab.Node
}

func (n node) nft(args ...string) (string, error) {
	argv := append([]string{"netns", "exec", n.Netns, "nft"}, args...)
	out, err := exec.Command("ip", argv...).CombinedOutput()
	if err != nil {
		return string(out), fmt.Errorf("ip %s: %w: %s", strings.Join(argv, " "), err, strings.TrimSpace(string(out)))
	}
	return string(out), nil
}

// rulesetLines is `nft list ruleset | wc -l` in the node's namespace.
func (n node) rulesetLines() (int, error) {
	out, err := n.nft("list", "ruleset")
	if err != nil {
		return 0, err
	}
	return strings.Count(out, "\n"), nil
}

// usage is a process's CPU time and memory from /proc.
type procUsage struct {
	CPU      time.Duration
	RSS, HWM int64 // bytes
}

func readUsage(pid int) (procUsage, error) {
	var u procUsage
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return u, err
	}
	// Fields after the command (which may hold spaces) start at state.
	f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+2:]))
	if len(f) < 13 {
		return u, fmt.Errorf("/proc/%d/stat: %d fields", pid, len(f))
	}
	ut, _ := strconv.ParseInt(f[11], 10, 64)
	st, _ := strconv.ParseInt(f[12], 10, 64)
	u.CPU = time.Duration(ut+st) * time.Second / 100 // USER_HZ
	b, err = os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return u, err
	}
	for _, l := range strings.Split(string(b), "\n") {
		k, v, ok := strings.Cut(l, ":")
		if !ok || (k != "VmRSS" && k != "VmHWM") {
			continue
		}
		kb, _ := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 10, 64)
		if k == "VmRSS" {
			u.RSS = kb << 10
		} else {
			u.HWM = kb << 10
		}
	}
	return u, nil
}

// restartAgent restarts the lab agent of n with its current command line
// minus flags, plus flags again when on (as `lab up` starts it: same daemon
// name, pid file and namespace; the pods keep running and the new agent
// adopts them), and returns its PID. Unless always, an agent already
// running as asked is left alone.
func restartAgent(s *lab.Spec, n lab.Node, flags []string, on, always bool) (int, error) {
	name := lab.AgentProc(n.Name)
	pid, ok := proc.Running(s.StateDir, name)
	if !ok {
		return 0, fmt.Errorf("agent of %s is not running", n.Name)
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/cmdline", pid))
	if err != nil {
		return 0, err
	}
	var argv []string
	had := false
	for _, a := range strings.Split(strings.TrimRight(string(b), "\x00"), "\x00") {
		f, _, _ := strings.Cut(a, "=")
		if contains(flags, f) {
			had = true
			continue
		}
		argv = append(argv, a)
	}
	if had == on && !always {
		return pid, nil
	}
	if on {
		argv = append(argv, flags...)
	}
	if err := proc.Stop(s.StateDir, name, 10*time.Second); err != nil {
		return 0, err
	}
	return proc.Start(name, argv, nil, s.StateDir, lab.NetnsPath(n.Netns))
}

func contains(xs []string, x string) bool {
	for _, y := range xs {
		if y == x {
			return true
		}
	}
	return false
}

// knpRBAC is what kube-network-policies' install.yaml grants its service
// account (v0.8.0), created here as it would be in a cluster.
func knpRBAC(ctx context.Context, c kubernetes.Interface) error {
	sa := &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "kube-system", Name: "kube-network-policies"}}
	if _, err := c.CoreV1().ServiceAccounts("kube-system").Create(ctx, sa, metav1.CreateOptions{}); ignoreExists(err) != nil {
		return err
	}
	role := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "kube-network-policies"},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"pods", "namespaces"}, Verbs: []string{"list", "watch"}},
			{APIGroups: []string{"networking.k8s.io"}, Resources: []string{"networkpolicies"}, Verbs: []string{"list", "watch"}},
		},
	}
	if _, err := c.RbacV1().ClusterRoles().Create(ctx, role, metav1.CreateOptions{}); ignoreExists(err) != nil {
		return err
	}
	bind := &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "kube-network-policies"},
		RoleRef:    rbacv1.RoleRef{APIGroup: "rbac.authorization.k8s.io", Kind: "ClusterRole", Name: "kube-network-policies"},
		Subjects:   []rbacv1.Subject{{Kind: "ServiceAccount", Namespace: "kube-system", Name: "kube-network-policies"}},
	}
	_, err := c.RbacV1().ClusterRoleBindings().Create(ctx, bind, metav1.CreateOptions{})
	return ignoreExists(err)
}

// startKNP runs kube-network-policies in node n's network namespace. It
// has no --kubeconfig (only the in-cluster config), so it gets what a pod
// would: KUBERNETES_SERVICE_HOST/PORT (the apiserver's address on the
// underlay) and a service-account token and the lab CA under
// /var/run/secrets/kubernetes.io/serviceaccount, on a tmpfs mounted over
// /run in a private mount namespace of its own (unshare), so the
// machine's /run is never touched. Flags: the node name; everything else
// as v0.8.0 ships it (NFQUEUE 100, fail closed, default log level; NRI
// finds no runtime socket in the lab and is left alone).
func startKNP(ctx context.Context, c kubernetes.Interface, s *lab.Spec, n node, bin, dir string) (pid int, note string, err error) {
	if err := knpRBAC(ctx, c); err != nil {
		return 0, "", fmt.Errorf("kube-network-policies RBAC: %w", err)
	}
	exp := int64(3600)
	tok, err := c.CoreV1().ServiceAccounts("kube-system").CreateToken(ctx, "kube-network-policies",
		&authv1.TokenRequest{Spec: authv1.TokenRequestSpec{ExpirationSeconds: &exp}}, metav1.CreateOptions{})
	if err != nil {
		return 0, "", fmt.Errorf("token for kube-network-policies: %w", err)
	}
	cfg, err := clientcmd.BuildConfigFromFlags("", s.Kubeconfig())
	if err != nil {
		return 0, "", err
	}
	host, port, ok := strings.Cut(strings.TrimPrefix(cfg.Host, "https://"), ":")
	if !ok {
		return 0, "", fmt.Errorf("apiserver address %q has no port", cfg.Host)
	}
	secrets := filepath.Join(dir, "knp-secrets")
	if err := os.MkdirAll(secrets, 0o700); err != nil {
		return 0, "", err
	}
	if err := os.WriteFile(filepath.Join(secrets, "token"), []byte(tok.Status.Token), 0o600); err != nil {
		return 0, "", err
	}
	if err := os.WriteFile(filepath.Join(secrets, "ca.crt"), cfg.CAData, 0o644); err != nil {
		return 0, "", err
	}
	if len(cfg.CAData) == 0 {
		ca, err := os.ReadFile(cfg.CAFile)
		if err != nil {
			return 0, "", fmt.Errorf("lab CA: %w", err)
		}
		if err := os.WriteFile(filepath.Join(secrets, "ca.crt"), ca, 0o644); err != nil {
			return 0, "", err
		}
	}
	if _, err := (node{}).rootTable(); err == nil {
		return 0, "", fmt.Errorf("the root namespace already has table inet %s: not starting kube-network-policies", knpTable)
	}
	script := `set -e
mount -t tmpfs -o size=1m,mode=0755 bench-knp /run
mkdir -p /run/secrets/kubernetes.io/serviceaccount
cp "$SECRETS/token" "$SECRETS/ca.crt" /run/secrets/kubernetes.io/serviceaccount/
exec "$@"`
	wrapper := []string{"unshare", "--mount", "--propagation", "private", "sh", "-c", script, "sh"}
	argv := []string{bin, "--hostname-override=" + n.Name}
	env := []string{"KUBERNETES_SERVICE_HOST=" + host, "KUBERNETES_SERVICE_PORT=" + port, "SECRETS=" + secrets}
	pid, err = proc.StartVia(knpProc, wrapper, argv, env, s.StateDir, lab.NetnsPath(n.Netns))
	if err != nil {
		return 0, "", err
	}
	// It must be in the node's namespace, never the machine's.
	var want, got unix.Stat_t
	if err1, err2 := unix.Stat(lab.NetnsPath(n.Netns), &want), unix.Stat(fmt.Sprintf("/proc/%d/ns/net", pid), &got); err1 != nil || err2 != nil || want.Ino != got.Ino {
		_ = stopKNP(s, n)
		return 0, "", fmt.Errorf("kube-network-policies (pid %d) is not in %s's network namespace", pid, n.Netns)
	}
	if !n.nftQueue() {
		// Its nftables transaction fails as a whole, so no table of its own
		// lands: the same diversion, in iptables' words.
		if err := n.knpDivert(true); err != nil {
			_ = stopKNP(s, n)
			return 0, "", err
		}
		note = "this kernel has no nftables queue expression (CONFIG_NFT_QUEUE unset), so kube-network-policies' own table fails to load " +
			"(it retries on every event); its NFQUEUE diversion is the same chain through iptables-nft's NFQUEUE target, queuing every new flow " +
			"through the node (its AdminNetworkPolicy-mode layout: the set of selected pods lives in the table that cannot load); verdicts are its own"
	}
	return pid, note, nil
}

// nftQueue reports whether the kernel has nftables' queue expression
// (CONFIG_NFT_QUEUE), which kube-network-policies' rules use to hand new
// flows to userspace, by loading one such rule in a table of ours in the
// node's namespace.
func (n node) nftQueue() bool {
	_, err := n.nft("add table inet bench-qprobe; add chain inet bench-qprobe c; add rule inet bench-qprobe c queue num 65000 bypass")
	_, _ = n.nft("delete", "table", "inet", "bench-qprobe")
	return err == nil
}

// divertChain holds the stand-in for kube-network-policies' postrouting
// chain on a kernel without CONFIG_NFT_QUEUE: the xtables NFQUEUE target
// (CONFIG_NETFILTER_XT_TARGET_NFQUEUE, through nft_compat) does what its
// `queue` rule does. Its rules, in its order: DNS accepted (its
// netfilter-bug-1766 workaround), traffic of the node's root user
// accepted (meta skuid 0), established flows accepted, everything else
// queued to 100, fail closed. Without its set of selected local pods
// (which lives in the table that could not be loaded) every new flow
// through the node is queued, as it lays out its rules in its
// AdminNetworkPolicy mode; its verdicts stay its own.
const divertChain = "BENCH-KNP"

func (n node) knpDivert(on bool) error {
	ipt := func(args ...string) error {
		argv := append([]string{"netns", "exec", n.Netns, "iptables-nft", "-w", "-t", "mangle"}, args...)
		if out, err := exec.Command("ip", argv...).CombinedOutput(); err != nil {
			return fmt.Errorf("ip %s: %w: %s", strings.Join(argv, " "), err, strings.TrimSpace(string(out)))
		}
		return nil
	}
	if !on {
		if ipt("-D", "POSTROUTING", "-j", divertChain) != nil {
			return nil // never installed
		}
		if err := ipt("-F", divertChain); err != nil {
			return err
		}
		return ipt("-X", divertChain)
	}
	for _, r := range [][]string{
		{"-N", divertChain},
		{"-A", divertChain, "-p", "udp", "--dport", "53", "-j", "ACCEPT"},
		{"-A", divertChain, "-m", "owner", "--uid-owner", "0", "-j", "ACCEPT"},
		{"-A", divertChain, "-m", "conntrack", "--ctstate", "ESTABLISHED,RELATED", "-j", "ACCEPT"},
		{"-A", divertChain, "-j", "NFQUEUE", "--queue-num", "100"},
		{"-A", "POSTROUTING", "-j", divertChain},
	} {
		if err := ipt(r...); err != nil {
			return err
		}
	}
	return nil
}

// rootTable lists the anchor's table in the root namespace: it must never
// be there.
func (node) rootTable() (string, error) {
	out, err := exec.Command("nft", "list", "table", "inet", knpTable).CombinedOutput()
	return string(out), err
}

// stopKNP stops the anchor with SIGINT, the one signal on which it removes
// its table (SIGTERM kills it with the table and its queue rule left,
// which would drop every new flow of a selected pod), then makes sure the
// table is gone from the node.
func stopKNP(s *lab.Spec, n node) error {
	if pid, ok := proc.Running(s.StateDir, knpProc); ok {
		_ = unix.Kill(pid, unix.SIGINT)
		for i := 0; i < 150; i++ {
			if _, ok := proc.Running(s.StateDir, knpProc); !ok {
				break
			}
			time.Sleep(100 * time.Millisecond)
		}
	}
	if err := proc.Stop(s.StateDir, knpProc, 5*time.Second); err != nil {
		return err
	}
	if err := n.knpDivert(false); err != nil {
		return err
	}
	if _, err := n.nft("list", "table", "inet", knpTable); err == nil {
		if _, err := n.nft("delete", "table", "inet", knpTable); err != nil {
			return err
		}
	}
	if _, err := (node{}).rootTable(); err == nil {
		return fmt.Errorf("table inet %s found in the root namespace", knpTable)
	}
	return nil
}

// hasFlag reports whether `flatnet agent --help` lists flag.
func hasFlag(flatnet, flag string) bool {
	out, _ := exec.Command(flatnet, "agent", "--help").CombinedOutput()
	return strings.Contains(string(out), flag+" ") || strings.Contains(string(out), flag+"=")
}

// metrics scrapes the enforcer's Prometheus endpoint in the node's
// namespace (both serve on port 9080: flatnet's policy metrics on
// 127.0.0.1, kube-network-policies' on every address) and keeps the
// series whose names start with one of prefixes, by their full text.
func (n node) metrics(prefixes ...string) (map[string]float64, error) {
	argv := []string{"netns", "exec", n.Netns, "curl", "-s", "--max-time", "5", "http://127.0.0.1:9080/metrics"}
	out, err := exec.Command("ip", argv...).Output()
	if err != nil {
		return nil, fmt.Errorf("ip %s: %w", strings.Join(argv, " "), err)
	}
	m := map[string]float64{}
	for _, l := range strings.Split(string(out), "\n") {
		i := strings.LastIndexByte(l, ' ')
		if i < 0 || strings.HasPrefix(l, "#") {
			continue
		}
		for _, p := range prefixes {
			if strings.HasPrefix(l, p) && !strings.Contains(l, "_bucket") {
				if v, err := strconv.ParseFloat(l[i+1:], 64); err == nil {
					m[l[:i]] = v
				}
			}
		}
	}
	return m, nil
}
