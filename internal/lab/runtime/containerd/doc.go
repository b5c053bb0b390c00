// Package containerd runs one real lab node: upstream containerd (with its
// runc shim and runc) and the upstream kubelet, inside the node's network
// namespace, as `flatnet lab up --runtime containerd` wants (issue 11). The
// lab creates the node's namespace and the control plane; this package
// brings the node's runtime up (Up) and takes it down leaving nothing (Down).
// MakePlan computes everything as data (paths, configs, command lines,
// mounts); Up and Down are the narrow apply.
//
// # One host, several kubelets
//
// A kubelet and a containerd assume they own the machine. What keeps the
// nodes of a lab (and of two labs) apart:
//
//   - Network: both daemons start with setns on the node's network
//     namespace only (internal/proc starts them from netns.Do). Never `ip
//     netns exec`: it also unshares the mount namespace and remounts /sys,
//     and runc then finds no cgroup mount. CNI plugins run as containerd's
//     children, so bridges and veths are made in the node's namespace; the
//     CRI stream server and the kubelet's ports (10250, 10248) bind there.
//   - Files: each node has its own containerd root, state, sockets and runc
//     root, kubelet --root-dir and --cert-dir, podLogsDir and
//     volumePluginDir, all under Node.Dir; pod network namespaces are mounted
//     under containerd's state (netns_mounts_under_state_dir), not in
//     /run/netns; NRI, CDI and /opt/containerd are off or moved.
//   - Paths they hard-code: the kubelet's /var/lib/kubelet/device-plugins
//     (every kubelet wipes it and listens on kubelet.sock there; a kubelet
//     whose socket another removed fails /healthz), /var/log/containers, the
//     shims' /run/containerd/s and libcni's /var/lib/cni cache. Each node
//     gets a private mount namespace, shared by its containerd and kubelet
//     (and so by the shims and CNI plugins they start), in which a directory
//     of the node is bind-mounted over each of these. The namespace is made
//     with unshare(1) as a slave copy of the host's mounts (host mounts such
//     as new /run/netns entries still reach it; nothing made inside
//     propagates out) and held by a bind mount of its nsfs file at
//     <Dir>/run/mnt, on a private self-bind of <Dir>/run, so it outlives
//     daemon restarts. Go cannot setns into a mount namespace once it runs
//     threads, so the daemons start through nsenter(1) --mount, which execs
//     them (proc.StartVia identifies them by their own command line). A
//     bonus: every mount the kubelet and containerd make (overlay root file
//     systems, volumes, the kubelet's self-bind of --root-dir, pod netns
//     files) lives only in that namespace and goes with it at Down: the host's
//     mount table only ever shows <Dir>/run and <Dir>/run/mnt. The empty mount
//     points on the host (/var/lib/kubelet, /var/log/containers,
//     /run/containerd, /var/lib/cni) are made once and never removed, as
//     /run/netns is: removing a directory that is a mount point in another
//     node's namespace would silently unmount it there.
//     Measured by TestTwoNodes: two nodes side by side, each kubelet
//     healthy and each pause pod Running, shims in their node's namespace and
//     cgroup, the host's mount table clean.
//   - Cgroups: the kubelet's cgroupRoot /flatnet-<lab>-<node> exists in every
//     hierarchy (this kind of machine is cgroup v1 hybrid: every v1
//     controller, name=systemd, and the v2 "unified" one, where runc also
//     makes cgroups); the shims run in <root>/shims (runc option ShimCgroup).
//     Down kills what is left in that tree and removes it depth-first in
//     every hierarchy. cAdvisor in each kubelet still watches every cgroup
//     of the host: CPU, not correctness.
//   - Processes: containerd and the kubelet are internal/proc daemons with
//     Node.Dir as their state dir, so their pid and log files are the node's
//     and they (and the shims, which inherit containerd's environment) carry
//     the owner mark of a dir under the lab's state dir: the lab's stragglers
//     sweep finds them, and Down finds this node's by its own dir.
//   - Host sysctls: the kubelet sets vm.overcommit_memory, kernel.panic and
//     kernel.panic_on_oops at start. RecordSysctls (called by Up, once per
//     lab) keeps their values in the lab's state dir; RestoreSysctls, after
//     the lab's last node is down, puts them back.
//   - This machine's root lacks CAP_SYS_RESOURCE: runc cannot lower
//     oom_score_adj, so containerd restricts it (restrict_oom_score_adj).
//
// # Up and Down
//
// Up is idempotent: files are rewritten only when their content differs,
// and a daemon is restarted only when it is not running or its config
// changed; a second Up of a running node starts nothing. It waits for
// containerd to answer the CRI (crictl version on its socket) and for the
// kubelet's /healthz on 127.0.0.1:10248 inside the node's namespace. Down
// stops the kubelet first (so it restarts nothing), removes every pod
// sandbox through the CRI (the CNI DEL frees addresses and veths), stops
// containerd, kills what is left by owner mark and cgroup, unmounts the
// node's run dir and namespace file (the namespace and all its mounts go
// with them), removes the cgroups and the node's dir.
package containerd
