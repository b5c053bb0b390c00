package proxy

import (
	"net/http"
	"strings"
	"testing"

	"github.com/flatnet/flatnet/internal/gateway/table"
)

// TestOddRequests: request forms a router rarely sees get an answer (no
// panic, no hang), through a table with a catch-all route.
func TestOddRequests(t *testing.T) {
	v1 := newBackend(t, "v1")
	var panics syncBuffer
	s := newTestServer(t, Options{})
	s.errLog.SetOutput(&panics)
	bind := freePort(t)
	mustUpdate(t, s, tableOf(port(bind, table.HTTP, hosted{"", []*table.Rule{rule("/", forward("HTTPRoute/ns/a", backendOf("ns/v1:80", 1, v1)))}})))
	for _, raw := range []string{
		"OPTIONS * HTTP/1.1\r\nHost: a\r\n\r\n",
		"CONNECT a.example.com:443 HTTP/1.1\r\nHost: a.example.com:443\r\n\r\n",
		"GET http://other.example.com/abs HTTP/1.1\r\nHost: a\r\n\r\n",
		"GET /a%2Fb/../c?x=%zz HTTP/1.1\r\nHost: a\r\n\r\n",
		"GET / HTTP/1.0\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: [::1]:80\r\n\r\n",
		"GET / HTTP/1.1\r\nHost: a\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n\r\n",
	} {
		c, br := sendRaw(t, bind, raw)
		resp, err := http.ReadResponse(br, nil)
		c.Close()
		line := strings.SplitN(raw, "\r\n", 2)[0]
		if err != nil {
			t.Errorf("%s: no answer: %v", line, err)
			continue
		}
		t.Logf("%s: %d", line, resp.StatusCode)
		if strings.HasPrefix(line, "CONNECT") && resp.StatusCode != http.StatusMethodNotAllowed {
			t.Errorf("%s: %d, want 405 (no tunnels through the gateway)", line, resp.StatusCode)
		}
	}
	if strings.Contains(panics.String(), "panic") {
		t.Errorf("the handler panicked:\n%s", panics.String())
	}
}
