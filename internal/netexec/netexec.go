// Package netexec is `flatnet netexec`, the workload the lab's tests and
// demo run in pods. It follows agnhost netexec from the Kubernetes e2e
// suite, so that tests written against agnhost read the same answers:
//
//   - HTTP (--http-port, default 8080):
//     /            "NOW: <time>"
//     /hostname    the hostname (the pod's, inside the lab); /hostName too
//     /clientip    the peer as "IP:port" (r.RemoteAddr, exactly as agnhost)
//     /echo?msg=M[&code=N]   M, with status N when given
//     /healthz     200 while the servers run
//     /dial?host=&port=&protocol=http|udp|tcp&request=&tries=N
//     makes the request N times from here and answers
//     {"responses":[...],"errors":[...]} (a key is left out when its list
//     is empty, as agnhost does), with status 200 either way (agnhost's
//     actual behaviour; its help text promises 417 but the code never
//     sends it). For http, request is a path ("hostname" or "/hostname").
//     /shutdown    exit 0;  /exit?code=N  exit N
//     /request, /request/...  (not agnhost's) the request as JSON
//     (RequestInfo: proto, method, host, path, query, headers, the
//     answering hostname), so a proxy's routing, rewrites and header
//     filters can be checked at the backend
//     /ws          (not agnhost's) a WebSocket that echoes every message
//     The port speaks HTTP/1.1 and HTTP/2 with prior knowledge (h2c), as
//     a backend whose Service port has appProtocol kubernetes.io/h2c.
//   - UDP (--udp-port, default 8081 as agnhost, -1 disables): one datagram
//     is one command, matched case-insensitively after trimming: "hostname",
//     "echo <msg>" (answers <msg>; agnhost lowercases it, we keep its case),
//     "clientip" ("IP:port"); anything else gets no answer, as agnhost.
//   - TCP (--tcp-port, default -1: off): line-oriented; each line is a
//     command as for UDP and each answer ends with "\n"; a line that is no
//     command is echoed back unchanged, so it is also a plain echo server.
//
// Two netexec processes in one pod share the pod's ports: give the second
// one other ports (or --udp-port=-1).
package netexec

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/miekg/dns"
	"github.com/spf13/cobra"
	"golang.org/x/net/websocket"
)

// Config says what to serve. A port of -1 disables that server; 0 picks a
// free port (tests).
type Config struct {
	Addr     string // listen address; "" is every address
	HTTPPort int
	UDPPort  int
	TCPPort  int
	// With DNSAnswer set, DNSPort serves DNSZone (and every name under
	// it) as DNSAnswer (dns.go).
	DNSPort   int
	DNSZone   string
	DNSAnswer string
	Log       io.Writer // request log; nil discards
}

// NewCommand returns `flatnet netexec`.
func NewCommand() *cobra.Command {
	cfg := Config{}
	cmd := &cobra.Command{
		Use:   "netexec",
		Short: "Test workload for pods: HTTP (/hostname, /clientip, /echo, /dial, ...), UDP and TCP echo servers (like agnhost netexec)",
		Long: "netexec serves HTTP on --http-port with /, /hostname, /clientip (\"IP:port\"), /echo?msg=, /healthz,\n" +
			"/dial?host=&port=&protocol=http|udp|tcp&request=&tries= ({\"responses\":[...],\"errors\":[...]}),\n" +
			"/shutdown and /exit?code=, /request[/...] (the request as JSON) and /ws (WebSocket echo), over\n" +
			"HTTP/1.1 and h2c; a UDP server on --udp-port answering \"hostname\", \"echo MSG\" and\n" +
			"\"clientip\"; and with --tcp-port a line-based TCP server answering the same commands and\n" +
			"echoing any other line.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg.Log = cmd.ErrOrStderr()
			s, err := Start(cfg)
			if err != nil {
				return err
			}
			code := s.Wait(cmd.Context())
			if code != 0 {
				os.Exit(code)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.IntVar(&cfg.HTTPPort, "http-port", 8080, "HTTP port")
	f.IntVar(&cfg.UDPPort, "udp-port", 8081, "UDP port (-1: no UDP server)")
	f.IntVar(&cfg.TCPPort, "tcp-port", -1, "TCP echo port (-1: no TCP server)")
	f.StringVar(&cfg.Addr, "listen-address", "", "address to listen on (default: all)")
	f.StringVar(&cfg.DNSAnswer, "dns-answer", "", "serve DNS on --dns-port (UDP and TCP): --dns-zone and every name under it resolve to this address, other names are REFUSED (default: no DNS server)")
	f.IntVar(&cfg.DNSPort, "dns-port", 53, "--dns-answer: the DNS port")
	f.StringVar(&cfg.DNSZone, "dns-zone", "external.test", "--dns-answer: the zone answered")
	cmd.AddCommand(newDFProbeCommand())
	return cmd
}

// Server is a running netexec.
type Server struct {
	cfg      Config
	log      *log.Logger
	httpLn   net.Listener
	httpSrv  *http.Server
	udpConn  *net.UDPConn
	tcpLn    net.Listener
	dnsUDP   *dns.Server
	dnsTCP   *dns.Server
	exitc    chan int
	exitOnce sync.Once
	wg       sync.WaitGroup
}

// Start opens every configured listener and serves in the background. It
// fails when a port cannot be bound.
func Start(cfg Config) (_ *Server, err error) {
	w := cfg.Log
	if w == nil {
		w = io.Discard
	}
	s := &Server{cfg: cfg, log: log.New(w, "netexec: ", log.LstdFlags), exitc: make(chan int, 1)}
	defer func() {
		if err != nil {
			s.close()
		}
	}()
	if cfg.HTTPPort >= 0 {
		if s.httpLn, err = net.Listen("tcp", net.JoinHostPort(cfg.Addr, strconv.Itoa(cfg.HTTPPort))); err != nil {
			return nil, fmt.Errorf("netexec: HTTP port %d: %w", cfg.HTTPPort, err)
		}
	}
	if cfg.UDPPort >= 0 {
		ua, err := net.ResolveUDPAddr("udp", net.JoinHostPort(cfg.Addr, strconv.Itoa(cfg.UDPPort)))
		if err != nil {
			return nil, fmt.Errorf("netexec: UDP address: %w", err)
		}
		if s.udpConn, err = net.ListenUDP("udp", ua); err != nil {
			return nil, fmt.Errorf("netexec: UDP port %d: %w (use --udp-port to pick another, -1 for none)", cfg.UDPPort, err)
		}
	}
	if cfg.TCPPort >= 0 {
		if s.tcpLn, err = net.Listen("tcp", net.JoinHostPort(cfg.Addr, strconv.Itoa(cfg.TCPPort))); err != nil {
			return nil, fmt.Errorf("netexec: TCP port %d: %w", cfg.TCPPort, err)
		}
	}
	if cfg.DNSAnswer != "" {
		if err = s.startDNS(); err != nil {
			return nil, err
		}
		s.log.Printf("serving DNS for %s on %s", cfg.DNSZone, s.DNSAddr())
		for _, d := range []*dns.Server{s.dnsUDP, s.dnsTCP} {
			s.wg.Add(1)
			go func() {
				defer s.wg.Done()
				_ = d.ActivateAndServe()
			}()
		}
	}
	if s.httpLn != nil {
		s.httpSrv = &http.Server{Handler: s.mux(), ReadHeaderTimeout: 10 * time.Second, Protocols: new(http.Protocols)}
		s.httpSrv.Protocols.SetHTTP1(true)
		s.httpSrv.Protocols.SetUnencryptedHTTP2(true)
		s.log.Printf("serving HTTP on %s", s.httpLn.Addr())
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			_ = s.httpSrv.Serve(s.httpLn)
		}()
	}
	if s.udpConn != nil {
		s.log.Printf("serving UDP on %s", s.udpConn.LocalAddr())
		s.wg.Add(1)
		go s.serveUDP()
	}
	if s.tcpLn != nil {
		s.log.Printf("serving TCP on %s", s.tcpLn.Addr())
		s.wg.Add(1)
		go s.serveTCP()
	}
	return s, nil
}

// HTTPAddr, UDPAddr and TCPAddr are the bound addresses ("" when off).
func (s *Server) HTTPAddr() string { return addrString(s.httpLn) }

// UDPAddr is the bound UDP address.
func (s *Server) UDPAddr() string {
	if s.udpConn == nil {
		return ""
	}
	return s.udpConn.LocalAddr().String()
}

// TCPAddr is the bound TCP echo address.
func (s *Server) TCPAddr() string { return addrString(s.tcpLn) }

func addrString(l net.Listener) string {
	if l == nil {
		return ""
	}
	return l.Addr().String()
}

// Wait serves until ctx ends (exit code 0) or a client asks for /shutdown
// or /exit (its code), then closes every listener and returns the code.
func (s *Server) Wait(ctx context.Context) int {
	code := 0
	select {
	case <-ctx.Done():
	case code = <-s.exitc:
	}
	s.close()
	s.wg.Wait()
	return code
}

func (s *Server) close() {
	if s.httpSrv != nil {
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		_ = s.httpSrv.Shutdown(sctx)
		cancel()
	} else if s.httpLn != nil {
		s.httpLn.Close()
	}
	if s.udpConn != nil {
		s.udpConn.Close()
	}
	if s.tcpLn != nil {
		s.tcpLn.Close()
	}
	for _, d := range []*dns.Server{s.dnsUDP, s.dnsTCP} {
		if d != nil {
			_ = d.Shutdown()
		}
	}
}

func (s *Server) requestExit(code int) {
	s.exitOnce.Do(func() { s.exitc <- code })
}

func hostname() string {
	h, err := os.Hostname()
	if err != nil {
		return "unknown: " + err.Error()
	}
	return h
}

// command answers the UDP/TCP command language; ok is false for text that
// is no command.
func command(text string, client net.Addr) (answer string, ok bool) {
	t := strings.TrimSpace(text)
	lower := strings.ToLower(t)
	switch {
	case lower == "hostname":
		return hostname(), true
	case lower == "clientip":
		return client.String(), true
	case strings.HasPrefix(lower, "echo "):
		return t[len("echo "):], true
	}
	return "", false
}

func (s *Server) serveUDP() {
	defer s.wg.Done()
	buf := make([]byte, 65536)
	for {
		n, peer, err := s.udpConn.ReadFromUDP(buf)
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			s.log.Printf("UDP read: %v", err)
			continue
		}
		ans, ok := command(string(buf[:n]), peer)
		if !ok {
			if strings.TrimSpace(string(buf[:n])) != "" {
				s.log.Printf("UDP: unknown command from %s: %q", peer, buf[:n])
			}
			continue
		}
		if _, err := s.udpConn.WriteToUDP([]byte(ans), peer); err != nil {
			s.log.Printf("UDP write to %s: %v", peer, err)
		}
	}
}

func (s *Server) serveTCP() {
	defer s.wg.Done()
	for {
		c, err := s.tcpLn.Accept()
		if err != nil {
			if errors.Is(err, net.ErrClosed) {
				return
			}
			s.log.Printf("TCP accept: %v", err)
			time.Sleep(100 * time.Millisecond)
			continue
		}
		go func() {
			defer c.Close()
			r := bufio.NewReader(c)
			for {
				_ = c.SetDeadline(time.Now().Add(5 * time.Minute))
				line, err := r.ReadString('\n')
				if line != "" {
					ans, ok := command(line, c.RemoteAddr())
					if !ok {
						ans = strings.TrimRight(line, "\r\n")
					}
					if _, werr := io.WriteString(c, ans+"\n"); werr != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		}()
	}
}

func (s *Server) mux() *http.ServeMux {
	m := http.NewServeMux()
	m.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/" {
			http.NotFound(w, r)
			return
		}
		fmt.Fprintf(w, "NOW: %v", time.Now())
	})
	host := func(w http.ResponseWriter, r *http.Request) {
		s.log.Printf("GET %s from %s", r.URL.Path, r.RemoteAddr)
		fmt.Fprint(w, hostname())
	}
	m.HandleFunc("/hostname", host)
	m.HandleFunc("/hostName", host)
	m.HandleFunc("/clientip", func(w http.ResponseWriter, r *http.Request) {
		s.log.Printf("GET /clientip from %s", r.RemoteAddr)
		fmt.Fprint(w, r.RemoteAddr)
	})
	m.HandleFunc("/echo", func(w http.ResponseWriter, r *http.Request) {
		msg, codeS := r.FormValue("msg"), r.FormValue("code")
		if codeS != "" {
			code, err := strconv.Atoi(codeS)
			if err != nil || code < 100 || code > 999 {
				http.Error(w, fmt.Sprintf("argument 'code' must be an HTTP status code, got %q", codeS), http.StatusBadRequest)
				return
			}
			w.WriteHeader(code)
		}
		fmt.Fprint(w, msg)
	})
	m.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	m.HandleFunc("/request", requestHandler)
	m.HandleFunc("/request/", requestHandler)
	// websocket.Server, not websocket.Handler: Handler refuses a client
	// without an Origin header, which proxies and tests need not send.
	m.Handle("/ws", websocket.Server{Handler: wsEcho})
	m.HandleFunc("/dial", s.dialHandler)
	m.HandleFunc("/shutdown", func(w http.ResponseWriter, _ *http.Request) {
		s.log.Printf("GET /shutdown: exiting")
		s.requestExit(0)
	})
	m.HandleFunc("/exit", func(w http.ResponseWriter, r *http.Request) {
		code := 0
		if c := r.FormValue("code"); c != "" {
			n, err := strconv.Atoi(c)
			if err != nil || n < 0 || n > 127 {
				http.Error(w, fmt.Sprintf("argument 'code' must be an integer in [0, 127], got %q", c), http.StatusBadRequest)
				return
			}
			code = n
		}
		s.log.Printf("GET /exit: exiting with %d", code)
		s.requestExit(code)
	})
	return m
}

// RequestInfo is /request's answer: the request as this server saw it.
type RequestInfo struct {
	Proto    string      `json:"proto"` // "HTTP/1.1", "HTTP/2.0"
	Method   string      `json:"method"`
	Host     string      `json:"host"`
	Path     string      `json:"path"`
	Query    string      `json:"query,omitempty"`
	Headers  http.Header `json:"headers"`
	Hostname string      `json:"hostname"` // the answering pod's
	Remote   string      `json:"remote"`   // the peer, "IP:port"
}

func requestHandler(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(RequestInfo{
		Proto: r.Proto, Method: r.Method, Host: r.Host, Path: r.URL.Path, Query: r.URL.RawQuery,
		Headers: r.Header, Hostname: hostname(), Remote: r.RemoteAddr,
	})
}

// wsMessage is one WebSocket message and its frame type (text or
// binary); wsCodec keeps the type, which websocket.Message drops.
type wsMessage struct {
	Data []byte
	Type byte
}

var wsCodec = websocket.Codec{
	Marshal: func(v any) ([]byte, byte, error) { m := v.(wsMessage); return m.Data, m.Type, nil },
	Unmarshal: func(data []byte, typ byte, v any) error {
		m := v.(*wsMessage)
		m.Data, m.Type = data, typ
		return nil
	},
}

// wsEcho sends each message back whole and of its type (io.Copy would
// cut a large message into several frames).
func wsEcho(c *websocket.Conn) {
	for {
		var m wsMessage
		if err := wsCodec.Receive(c, &m); err != nil {
			return
		}
		if err := wsCodec.Send(c, m); err != nil {
			return
		}
	}
}

// DialResult is /dial's answer, agnhost's shape.
type DialResult struct {
	Responses []string `json:"responses,omitempty"`
	Errors    []string `json:"errors,omitempty"`
}

const dialTimeout = 5 * time.Second

func (s *Server) dialHandler(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	host, port, request, proto := q.Get("host"), q.Get("port"), q.Get("request"), strings.ToLower(q.Get("protocol"))
	tries := 1
	if t := q.Get("tries"); t != "" {
		n, err := strconv.Atoi(t)
		if err != nil || n < 1 || n > 1000 {
			http.Error(w, fmt.Sprintf("tries parameter is invalid: %q (want 1..1000)", t), http.StatusBadRequest)
			return
		}
		tries = n
	}
	if request == "" {
		http.Error(w, "request parameter not specified", http.StatusBadRequest)
		return
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 || host == "" {
		http.Error(w, fmt.Sprintf("host and/or port param are invalid: host=%q port=%q", host, port), http.StatusBadRequest)
		return
	}
	hostPort := net.JoinHostPort(host, port)
	var dial func(ctx context.Context, hostPort, request string) (string, error)
	switch proto {
	case "", "http":
		dial = dialHTTP
	case "udp":
		dial = dialUDP
	case "tcp":
		dial = dialTCP
	default:
		http.Error(w, fmt.Sprintf("unsupported protocol %q (want http, udp or tcp)", proto), http.StatusBadRequest)
		return
	}
	s.log.Printf("GET /dial?host=%s&port=%s&protocol=%s&request=%s&tries=%d", host, port, proto, request, tries)
	var res DialResult
	for range tries {
		ans, err := dial(r.Context(), hostPort, request)
		if err != nil {
			res.Errors = append(res.Errors, err.Error())
		} else {
			res.Responses = append(res.Responses, ans)
		}
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(res)
}

func dialHTTP(ctx context.Context, hostPort, request string) (string, error) {
	ctx, cancel := context.WithTimeout(ctx, dialTimeout)
	defer cancel()
	tr := &http.Transport{DisableKeepAlives: true, Proxy: nil}
	defer tr.CloseIdleConnections()
	u := "http://" + hostPort + "/" + strings.TrimPrefix(request, "/")
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return "", err
	}
	resp, err := (&http.Client{Transport: tr}).Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return "", fmt.Errorf("reading the answer from %s: %w", u, err)
	}
	return string(body), nil
}

func dialUDP(ctx context.Context, hostPort, request string) (string, error) {
	var d net.Dialer
	c, err := d.DialContext(ctx, "udp", hostPort)
	if err != nil {
		return "", fmt.Errorf("udp dial failed: %w", err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(dialTimeout))
	if _, err := c.Write([]byte(request)); err != nil {
		return "", fmt.Errorf("udp write to %s failed: %w", hostPort, err)
	}
	buf := make([]byte, 65536)
	n, err := c.Read(buf)
	if err != nil {
		return "", fmt.Errorf("reading from udp %s failed: %w", hostPort, err)
	}
	return string(buf[:n]), nil
}

func dialTCP(ctx context.Context, hostPort, request string) (string, error) {
	d := net.Dialer{Timeout: dialTimeout}
	c, err := d.DialContext(ctx, "tcp", hostPort)
	if err != nil {
		return "", fmt.Errorf("tcp dial failed: %w", err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(dialTimeout))
	if _, err := io.WriteString(c, request+"\n"); err != nil {
		return "", fmt.Errorf("tcp write to %s failed: %w", hostPort, err)
	}
	line, err := bufio.NewReader(c).ReadString('\n')
	if err != nil && !(errors.Is(err, io.EOF) && line != "") {
		return "", fmt.Errorf("reading from tcp %s failed: %w", hostPort, err)
	}
	return strings.TrimRight(line, "\r\n"), nil
}
