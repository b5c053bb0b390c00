package netexec

import (
	"context"
	"encoding/binary"
	"net"
	"net/netip"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/flatnet/flatnet/internal/netns"
	"github.com/flatnet/flatnet/internal/testutil"
)

func TestParseExtendedErr(t *testing.T) {
	b := make([]byte, 32)
	binary.NativeEndian.PutUint32(b[0:4], uint32(unix.EMSGSIZE))
	b[4], b[5], b[6] = unix.SO_EE_ORIGIN_ICMP, 3, 4
	binary.NativeEndian.PutUint32(b[8:12], 1450)
	binary.NativeEndian.PutUint16(b[16:18], unix.AF_INET)
	copy(b[20:24], []byte{10, 244, 1, 1})
	ee, from, ok := parseExtendedErr(b)
	if !ok || ee.Type != 3 || ee.Code != 4 || ee.Info != 1450 || from != netip.MustParseAddr("10.244.1.1") {
		t.Fatalf("got %+v %s %v", ee, from, ok)
	}
	if _, _, ok := parseExtendedErr(b[:15]); ok {
		t.Fatal("short buffer parsed")
	}
	if _, from, ok := parseExtendedErr(b[:16]); !ok || from.IsValid() {
		t.Fatalf("no offender: %s %v", from, ok)
	}
}

func FuzzParseExtendedErr(f *testing.F) {
	f.Add(make([]byte, 32))
	f.Add([]byte{1, 2, 3})
	f.Fuzz(func(t *testing.T, b []byte) {
		_, _, _ = parseExtendedErr(b)
	})
}

func TestProbeDFArgs(t *testing.T) {
	ctx := context.Background()
	if _, err := ProbeDF(ctx, netip.MustParseAddrPort("[fd00::1]:8081"), 1500, 1, time.Second); err == nil {
		t.Error("IPv6 target accepted")
	}
	for _, size := range []int{33, 65536} {
		if _, err := ProbeDF(ctx, netip.MustParseAddrPort("127.0.0.1:8081"), size, 1, time.Second); err == nil {
			t.Errorf("size %d accepted", size)
		}
	}
}

// TestProbeDFPath runs the probe through a router whose far side has a
// smaller MTU: client (1500) -- router -- (1400) server.
func TestProbeDFPath(t *testing.T) {
	testutil.RequireRoot(t)
	testutil.RequireFreeRange(t, "10.251.71.0/24", "10.251.72.0/24")
	client, router, server := testutil.NewNetNS(t), testutil.NewNetNS(t), testutil.NewNetNS(t)
	testutil.Wire(t, client, "eth0", []string{"10.251.71.2/24"}, router, "c0", []string{"10.251.71.1/24"})
	testutil.Wire(t, server, "eth0", []string{"10.251.72.2/24"}, router, "s0", []string{"10.251.72.1/24"})
	testutil.Run(t, "ip", "-n", testutil.NSName(server), "link", "set", "eth0", "mtu", "1400")
	testutil.Run(t, "ip", "-n", testutil.NSName(router), "link", "set", "s0", "mtu", "1400")
	testutil.RunIn(t, router, "sysctl", "-qw", "net.ipv4.ip_forward=1")
	testutil.Run(t, "ip", "-n", testutil.NSName(client), "route", "add", "10.251.72.0/24", "via", "10.251.71.1")
	testutil.Run(t, "ip", "-n", testutil.NSName(server), "route", "add", "10.251.71.0/24", "via", "10.251.72.1")

	var srv *Server
	if err := netns.Do(server, func() error {
		var err error
		srv, err = Start(Config{Addr: "10.251.72.2", HTTPPort: -1, UDPPort: 0, TCPPort: -1})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan int)
	go func() { done <- srv.Wait(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	to := netip.MustParseAddrPort(srv.UDPAddr())

	// A UDP port that never answers.
	var silent *net.UDPConn
	if err := netns.Do(server, func() error {
		var err error
		silent, err = net.ListenUDP("udp", &net.UDPAddr{IP: net.ParseIP("10.251.72.2")})
		return err
	}); err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	silentAP := netip.MustParseAddrPort(silent.LocalAddr().String())

	probe := func(to netip.AddrPort, size int, timeout time.Duration) ProbeResult {
		t.Helper()
		var res ProbeResult
		if err := netns.Do(client, func() error {
			var err error
			res, err = ProbeDF(context.Background(), to, size, 1, timeout)
			return err
		}); err != nil {
			t.Fatal(err)
		}
		return res
	}
	cases := []struct {
		name    string
		to      netip.AddrPort
		size    int
		timeout time.Duration
		want    ProbeResult
	}{
		{"fits the path", to, 1400, 3 * time.Second, ProbeResult{Size: 1400, Result: ProbeDelivered, From: to.String(), Tries: 1}},
		{"one byte over", to, 1401, 3 * time.Second, ProbeResult{Size: 1401, Result: ProbeFragNeeded, MTU: 1400, From: "10.251.71.1", ICMPType: 3, ICMPCode: 4, Tries: 1}},
		// The cached path MTU does not stop the next probe.
		{"again", to, 1401, 3 * time.Second, ProbeResult{Size: 1401, Result: ProbeFragNeeded, MTU: 1400, From: "10.251.71.1", ICMPType: 3, ICMPCode: 4, Tries: 1}},
		{"still fits", to, 1400, 3 * time.Second, ProbeResult{Size: 1400, Result: ProbeDelivered, From: to.String(), Tries: 1}},
		{"over the local MTU", to, 1501, 3 * time.Second, ProbeResult{Size: 1501, Result: ProbeLocalTooBig, MTU: 1500, Tries: 1}},
		{"closed port", netip.AddrPortFrom(to.Addr(), 9), 100, 3 * time.Second, ProbeResult{Size: 100, Result: ProbeICMP, From: "10.251.72.2", ICMPType: 3, ICMPCode: 3, Tries: 1}},
		{"no answer", silentAP, 100, 300 * time.Millisecond, ProbeResult{Size: 100, Result: ProbeNoAnswer, Tries: 1}},
	}
	for _, c := range cases {
		if got := probe(c.to, c.size, c.timeout); got != c.want {
			t.Errorf("%s: got %+v, want %+v", c.name, got, c.want)
		}
	}
}
