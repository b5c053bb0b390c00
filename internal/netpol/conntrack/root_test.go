package conntrack

import (
	"bufio"
	"fmt"
	"net"
	"net/netip"
	"os/exec"
	"testing"
	"time"

	"github.com/flatnet/flatnet/internal/netns"
	"github.com/flatnet/flatnet/internal/netpol"
	"github.com/flatnet/flatnet/internal/testutil"
)

func TestMain(m *testing.M) { testutil.Main(m) }

// TestRootCutsAnEstablishedConnection opens a TCP connection inside a
// namespace the test creates (conntrack on, through a table that uses
// ct), and checks that Cut deletes its entry exactly when the rules deny
// it.
func TestRootCutsAnEstablishedConnection(t *testing.T) {
	ns := testutil.NewNetNS(t)
	table := testutil.Name("fntct")
	testutil.Run(t, "ip", "netns", "exec", testutil.NSName(ns), "nft",
		fmt.Sprintf("add table inet %s; add chain inet %s in { type filter hook input priority 0; ct state established accept; }", table, table))

	var ln net.Listener
	var conn net.Conn
	err := netns.Do(ns, func() error {
		var err error
		if ln, err = net.Listen("tcp", "127.0.0.1:0"); err != nil {
			return err
		}
		conn, err = net.DialTimeout("tcp", ln.Addr().String(), 3*time.Second)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	defer conn.Close()
	srv, err := ln.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer srv.Close()
	go func() { _, _ = bufio.NewReader(srv).ReadString('\n') }()
	port := uint16(ln.Addr().(*net.TCPAddr).Port)

	count := func() string {
		out, _ := exec.Command("ip", "netns", "exec", testutil.NSName(ns), "conntrack", "-L", "-p", "tcp", "--dport", fmt.Sprint(port)).CombinedOutput()
		return string(out)
	}
	lo := netip.MustParseAddr("127.0.0.1")
	pod := &netpol.Pod{IPs: []netip.Addr{lo}}
	pod.Ingress.Isolated = true
	pod.Ingress.Allowed = []netpol.Allow{{Entry: netpol.Entry{Peer: netip.PrefixFrom(lo, 32), Proto: netpol.ProtoTCP, From: port, To: port}}}
	var n int
	if err := netns.Do(ns, func() (err error) { n, err = Cut(Netlink{}, Pods{lo: pod}); return err }); err != nil || n != 0 {
		t.Fatalf("Cut with the flow allowed = %d, %v; want 0\n%s", n, err, count())
	}
	pod.Ingress.Allowed[0].From, pod.Ingress.Allowed[0].To = port+1, port+1
	if err := netns.Do(ns, func() (err error) { n, err = Cut(Netlink{}, Pods{lo: pod}); return err }); err != nil || n != 1 {
		t.Fatalf("Cut with the flow denied = %d, %v; want 1\n%s", n, err, count())
	}
}
