package proxy

import (
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/flatnet/flatnet/internal/gateway/table"
)

// Upstream connection pools. One Transport per backend protocol, shared by
// every route: pools are keyed by endpoint inside it.
const (
	// maxIdlePerEndpoint keeps enough warm connections to one pod for a
	// few hundred concurrent requests (the default, 2, churns connections
	// under any real load).
	maxIdlePerEndpoint = 512
	// idleTimeout is shorter than the idle timeouts backends commonly use
	// (Node.js 5 s, nginx 75 s), so the proxy closes an idle connection
	// before the backend does and rarely reuses one being closed; a GET
	// that still hits one is retried once by the Transport.
	idleTimeout = 4 * time.Second
)

func newTransport(h2c bool) *http.Transport {
	d := &net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}
	t := &http.Transport{
		DialContext:         d.DialContext,
		MaxIdleConns:        0, // no global cap: the per-endpoint one bounds it
		MaxIdleConnsPerHost: maxIdlePerEndpoint,
		IdleConnTimeout:     idleTimeout,
		// A proxy passes Accept-Encoding through and must not add its own.
		DisableCompression:    true,
		ExpectContinueTimeout: time.Second,
		ReadBufferSize:        16 << 10,
		WriteBufferSize:       16 << 10,
	}
	if h2c {
		// HTTP/2 with prior knowledge to backends whose appProtocol is
		// kubernetes.io/h2c, and to gRPC backends.
		t.Protocols = new(http.Protocols)
		t.Protocols.SetUnencryptedHTTP2(true)
	}
	return t
}

// bufferPool is httputil.BufferPool over 32 KiB buffers, so copying a
// response body allocates nothing once warm.
type bufferPool struct{ p sync.Pool }

const bufSize = 32 << 10

func (b *bufferPool) Get() []byte {
	if v, ok := b.p.Get().(*[bufSize]byte); ok {
		return v[:]
	}
	return new([bufSize]byte)[:]
}

// Put keeps the array pointer itself in the pool, so putting allocates
// nothing either.
func (b *bufferPool) Put(buf []byte) {
	if cap(buf) < bufSize {
		return
	}
	b.p.Put((*[bufSize]byte)(buf[:bufSize]))
}

// tlsConfig terminates TLS for one port with the certificate that port has
// in the current table, picked by SNI.
func (s *Server) tlsConfig(bind int32) *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		NextProtos: []string{"h2", "http/1.1"},
		GetCertificate: func(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
			g := s.cur.Load()
			if g == nil {
				return nil, errNoTable
			}
			p := g.t.Ports[bind]
			if p == nil || p.Protocol != table.HTTPS {
				return nil, fmt.Errorf("port %d serves no TLS now", bind)
			}
			return p.Certificate(hello)
		},
	}
}

var errNoTable = errors.New("no routing table yet")
