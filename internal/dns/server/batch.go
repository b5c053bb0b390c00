package server

import (
	"context"
	"errors"
	"net"
	"time"

	"golang.org/x/net/ipv4"
	"golang.org/x/net/ipv6"
	"golang.org/x/sys/unix"
)

// batchConn is a UDP socket read and written with recvmmsg and sendmmsg
// (x/net's ipv4 and ipv6 PacketConns; their Message types are one type).
type batchConn interface {
	ReadBatch(ms []ipv4.Message, flags int) (int, error)
	WriteBatch(ms []ipv4.Message, flags int) (int, error)
}

const (
	batchSize = 32
	// maxQuery is the largest UDP query read; a bigger one (MSG_TRUNC)
	// is dropped: real queries are a few hundred bytes.
	maxQuery = 8192
)

// serveUDPBatch is the read loop on a UDP socket: up to batchSize queries
// per recvmmsg, the cache hits among them answered with one sendmmsg. Under
// load the per-packet system call cost is what bounds a DNS server on one
// core; batching divides it. At low rates a batch is one query and this is
// the plain loop.
func (s *Server) serveUDPBatch(ctx context.Context, c *net.UDPConn) {
	var bc batchConn = ipv4.NewPacketConn(c)
	if la, ok := c.LocalAddr().(*net.UDPAddr); ok && la.IP.To4() == nil {
		bc = ipv6.NewPacketConn(c)
	}
	rms := make([]ipv4.Message, batchSize)
	for i := range rms {
		rms[i].Buffers = [][]byte{make([]byte, maxQuery)}
	}
	wms := make([]ipv4.Message, batchSize)
	outs := make([][]byte, batchSize)
	for i := range wms {
		wms[i].Buffers = [][]byte{nil}
		outs[i] = make([]byte, 0, 1024)
	}
	key := make([]byte, 0, 300)
	for {
		n, err := bc.ReadBatch(rms, 0)
		if err != nil {
			if ctx.Err() != nil || errors.Is(err, net.ErrClosed) {
				return
			}
			continue
		}
		start := time.Now()
		w := 0
		for i := range n {
			m := &rms[i]
			if m.Flags&unix.MSG_TRUNC != 0 {
				continue
			}
			b := m.Buffers[0][:m.N]
			ua, ok := m.Addr.(*net.UDPAddr)
			if !ok {
				continue
			}
			from := ua.AddrPort()
			var reply []byte
			if reply, key = s.fast(outs[w][:0], key, b, from, false, start); reply != nil {
				outs[w] = reply
				wms[w].Buffers[0] = reply
				wms[w].Addr = m.Addr
				w++
				continue
			}
			s.goSlow(ctx, b, from, start, func(r []byte) {
				c.WriteToUDPAddrPort(r, from) //nolint:errcheck // the client retries
			})
		}
		for sent := 0; sent < w; {
			k, err := bc.WriteBatch(wms[sent:w], 0)
			if err != nil {
				break // the clients retry
			}
			sent += k
		}
	}
}
