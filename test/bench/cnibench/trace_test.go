package main

import (
	"strings"
	"testing"
)

// A trimmed real log: a Go plugin (pid 100) with a runtime thread (101)
// whose calls are logged before its clone returns, a vfork'd child (102)
// that runs iptables, and another (103) that runs host-local.
const sampleTrace = `100 1000.000000 execve("/opt/cni/bin/bridge", ["/opt/cni/bin/bridge"], 0x7ffe /* 9 vars */) = 0
100 1000.001000 clone(child_stack=0xc000, flags=CLONE_VM|CLONE_FS|CLONE_FILES|CLONE_SIGHAND|CLONE_SYSVSEM|CLONE_THREAD, tls=0xc0 <unfinished ...>
101 1000.001100 sendto(3<NETLINK:[ROUTE:100]>, [{nlmsg_len=32, nlmsg_type=RTM_NEWLINK}], 32, 0, NULL, 0) = 32
100 1000.001200 <... clone resumed>) = 101
101 1000.002000 openat(AT_FDCWD</>, "/proc/sys/net/ipv4/ip_forward", O_WRONLY|O_CLOEXEC) = 7</proc/sys/net/ipv4/ip_forward>
100 1000.002500 openat(AT_FDCWD</>, "/proc/sys/net/ipv6/conf/all/disable_ipv6", O_RDONLY|O_CLOEXEC) = 7
100 1000.002600 openat(AT_FDCWD</>, "/proc/sys/net/ipv6/conf/nope", O_RDONLY|O_CLOEXEC) = -1 ENOENT (No such file or directory)
101 1000.003000 clone(child_stack=NULL, flags=CLONE_VM|CLONE_VFORK|SIGCHLD <unfinished ...>
102 1000.003100 execve("/usr/sbin/iptables", ["iptables", "-t", "nat", "-N", "CNI-x", "--wait"], 0x7ffd /* 9 vars */) = 0
101 1000.003200 <... clone resumed>) = 102
102 1000.004000 sendmsg(3<NETLINK:[NETFILTER:102]>, {msg_name={sa_family=AF_NETLINK}}, 0) = 300
102 1000.004100 sendto(3<NETLINK:[14649]>, [{nlmsg_len=20}], 20, 0, NULL, 0) = 20
102 1000.009000 +++ exited with 0 +++
100 1000.010000 vfork() = 103
103 1000.010100 execve("/usr/bin/missing", ["missing"], 0x1 /* 9 vars */) = -1 ENOENT (No such file or directory)
103 1000.010200 execve("/opt/cni/bin/host-local", ["/opt/cni/bin/host-local"], 0x1 /* 9 vars */) = 0
103 1000.015200 +++ exited with 0 +++
101 1000.020000 +++ exited with 0 +++
100 1000.020000 +++ exited with 0 +++
`

func TestParseStrace(t *testing.T) {
	progs, err := ParseStrace(strings.NewReader(sampleTrace))
	if err != nil {
		t.Fatal(err)
	}
	by := map[string]*ProgramStats{}
	var order []string
	for _, p := range progs {
		by[p.Program] = p
		order = append(order, p.Program)
	}
	if strings.Join(order, ",") != "bridge,iptables,host-local" {
		t.Fatalf("programs = %v, want bridge first, then iptables, host-local", order)
	}
	br, ipt, hl := by["bridge"], by["iptables"], by["host-local"]
	if br.Procs != 1 || br.RtNetlink != 1 || br.NfNetlink != 0 || br.SysctlWrites != 1 || br.SysctlReads != 1 {
		t.Errorf("bridge = %+v (thread 101's calls belong to the bridge)", br)
	}
	if len(br.Sysctls) != 1 || br.Sysctls[0] != "net/ipv4/ip_forward" {
		t.Errorf("bridge sysctls = %v", br.Sysctls)
	}
	if ipt.Procs != 1 || ipt.NfNetlink != 1 || ipt.OtherNetlink != 1 || ipt.RtNetlink != 0 {
		t.Errorf("iptables = %+v", ipt)
	}
	if len(ipt.Commands) != 1 || ipt.Commands[0] != "iptables -t nat -N CNI-x --wait" {
		t.Errorf("iptables commands = %q", ipt.Commands)
	}
	if hl.Procs != 1 || int(hl.WallMS+0.5) != 5 {
		t.Errorf("host-local = %+v, want 1 proc, 5 ms", hl)
	}
	if int(br.WallMS+0.5) != 20 || int(ipt.WallMS+0.5) != 6 {
		t.Errorf("wall: bridge %.2f ms (want 20), iptables %.2f ms (want 6)", br.WallMS, ipt.WallMS)
	}
}

func TestParseStraceEmpty(t *testing.T) {
	if _, err := ParseStrace(strings.NewReader("garbage\n100 1.0 execve(\"/x\", [\"x\"], 0x1) = -1 ENOENT\n")); err == nil {
		t.Error("a log without a successful execve must be an error")
	}
}
