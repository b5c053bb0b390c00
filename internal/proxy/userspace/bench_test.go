package userspace

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/netip"
	"slices"
	"testing"
	"time"

	"github.com/flatnet/flatnet/internal/proxy"
)

// BenchmarkProxy measures what the userspace mode costs a connection on
// loopback, against a direct connection to the endpoint in the same run
// (the anchor; a kernel mode's DNAT adds next to nothing to it):
//
//	connect: dial, one 1-byte request and answer, close (new connections
//	         per second = 1e9 / ns/op, one client at a time);
//	rtt:     one 1-byte request and answer on an open connection.
//
// p50-ns and p99-ns are per operation.
//
//	go test -run '^$' -bench Proxy -benchtime 20000x ./internal/proxy/userspace/
func BenchmarkProxy(b *testing.B) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	ep := serveTCP(b, ln, func(c net.Conn) { _, _ = io.Copy(c, c) }) // echo
	be := New(Config{Addrs: newFakeAddrs()})
	defer be.Close()
	svc := service("bench", "127.78.0.10", proxy.TCP, 8080, proxy.Endpoint{IP: ep.Addr(), Port: ep.Port(), Ready: true})
	if _, err := be.Sync(context.Background(), []*proxy.Service{svc}, nil, true); err != nil {
		b.Fatal(err)
	}
	for _, target := range []struct {
		name string
		addr netip.AddrPort
	}{{"direct", ep}, {"userspace", netip.MustParseAddrPort("127.78.0.10:8080")}} {
		b.Run("connect/"+target.name, func(b *testing.B) {
			lat := make([]time.Duration, 0, b.N)
			buf := make([]byte, 1)
			for b.Loop() {
				start := time.Now()
				c, err := net.DialTCP("tcp", nil, net.TCPAddrFromAddrPort(target.addr))
				if err != nil {
					b.Fatal(err)
				}
				if err := roundTrip(c, buf); err != nil {
					b.Fatal(err)
				}
				// A reset, not a FIN: no TIME_WAIT pile-up on the client.
				_ = c.SetLinger(0)
				_ = c.Close()
				lat = append(lat, time.Since(start))
			}
			report(b, lat)
		})
		b.Run("rtt/"+target.name, func(b *testing.B) {
			c, err := net.DialTCP("tcp", nil, net.TCPAddrFromAddrPort(target.addr))
			if err != nil {
				b.Fatal(err)
			}
			defer c.Close()
			lat := make([]time.Duration, 0, b.N)
			buf := make([]byte, 1)
			for b.Loop() {
				start := time.Now()
				if err := roundTrip(c, buf); err != nil {
					b.Fatal(err)
				}
				lat = append(lat, time.Since(start))
			}
			report(b, lat)
		})
	}
}

func roundTrip(c *net.TCPConn, buf []byte) error {
	if _, err := c.Write(buf); err != nil {
		return err
	}
	_, err := io.ReadFull(c, buf)
	return err
}

func report(b *testing.B, lat []time.Duration) {
	if len(lat) == 0 {
		return
	}
	slices.Sort(lat)
	b.ReportMetric(float64(lat[len(lat)/2].Nanoseconds()), "p50-ns")
	b.ReportMetric(float64(lat[len(lat)*99/100].Nanoseconds()), "p99-ns")
}

// BenchmarkSync measures syncs with the addresses faked (no netlink):
// a full sync from nothing opens one listener per service (the cold
// start), a partial one changes one service's endpoint.
//
//	go test -run '^$' -bench Sync -benchtime 5x ./internal/proxy/userspace/
func BenchmarkSync(b *testing.B) {
	for _, n := range []int{1000, 10000} {
		svcs := make([]*proxy.Service, n)
		for i := range svcs {
			ip := netip.AddrFrom4([4]byte{127, 79, byte(i / 250), byte(i%250 + 1)})
			svcs[i] = service(fmt.Sprint("s", i), ip.String(), proxy.TCP, 8080,
				proxy.Endpoint{IP: netip.MustParseAddr("10.1.0.1"), Port: 80, Ready: true})
		}
		b.Run(fmt.Sprintf("full/%d", n), func(b *testing.B) {
			for b.Loop() {
				be := New(Config{Addrs: newFakeAddrs()})
				if _, err := be.Sync(context.Background(), svcs, nil, true); err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				be.Close()
				b.StartTimer()
			}
		})
		b.Run(fmt.Sprintf("partial/%d", n), func(b *testing.B) {
			be := New(Config{Addrs: newFakeAddrs()})
			defer be.Close()
			if _, err := be.Sync(context.Background(), svcs, nil, true); err != nil {
				b.Fatal(err)
			}
			changed := proxy.Changes{svcs[0].Key(): svcs[0]}
			for b.Loop() {
				svcs[0].Ports[0].Endpoints[0].Port++
				res, err := be.Sync(context.Background(), svcs, changed, false)
				if err != nil || res.Operations != 0 {
					b.Fatal(err, res.Operations)
				}
			}
		})
	}
}
