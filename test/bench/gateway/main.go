// Command gwbench drives make bench-gateway (hack/bench-gateway.sh):
// flatnet's gateway data plane serving a routing table built here
// directly (no controller), the equivalent nginx configuration, and the
// data plane's own route change to first served request.
//
//	gwbench serve -listen IP:PORT -routes N -backends IP:PORT,...
//	    builds a table of N HTTPRoutes (host r<i>.bench.example, PathPrefix
//	    "/", the backends as one Service's endpoints), serves it with
//	    internal/gateway/proxy and prints "ready rss_kib=..." once it is
//	    listening; runs until SIGTERM or SIGINT.
//	gwbench nginx-conf -listen IP:PORT -routes N -backends ... -dir DIR
//	    prints nginx.conf for the same N routes as an nginx reverse proxy
//	    (one server block per hostname, upstream keepalive).
//	gwbench backend-conf -listen IP:PORT,... -dir DIR
//	    prints nginx.conf for the echo backends (1 KiB body on every port).
//	gwbench change -routes N -changes K -backends ...
//	    the data plane's share of a route change: K times, build a table
//	    of N routes plus a new one, Update, and probe the new hostname until
//	    it answers 200; prints p50/p99 of build+update+served (total), of
//	    the table's Finish (indexes and sorting, part of the build) and
//	    of update+served. The controller's share (watch, compile) is not in
//	    it: see hack/bench-gateway.sh, ROUTE_CHANGE_HOOK.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"runtime/pprof"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/flatnet/flatnet/internal/gateway/proxy"
	"github.com/flatnet/flatnet/internal/gateway/table"
)

// BodySize is what every backend answers, in bytes.
const BodySize = 1024

func main() {
	if len(os.Args) < 2 {
		fmt.Fprintln(os.Stderr, "usage: gwbench serve|nginx-conf|backend-conf|change [flags]")
		os.Exit(2)
	}
	var err error
	switch cmd, args := os.Args[1], os.Args[2:]; cmd {
	case "serve":
		err = serve(args)
	case "nginx-conf":
		err = nginxConf(args)
	case "backend-conf":
		err = backendConf(args)
	case "change":
		err = change(args)
	default:
		err = fmt.Errorf("unknown command %q", cmd)
	}
	if err != nil {
		fmt.Fprintln(os.Stderr, "gwbench:", err)
		os.Exit(1)
	}
}

// Host is the hostname of route i; the load goes to Host(Routes/2).
func Host(i int) string { return fmt.Sprintf("r%d.bench.example", i) }

// buildTable is what the compiler would produce for n HTTPRoutes, each
// with its own hostname and one rule to the backends, plus extra routes.
func buildTable(bind int32, n int, backends []string, gen uint64, extra ...string) (*table.Table, time.Duration) {
	p := table.NewPort(bind, bind, table.HTTP)
	created := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	add := func(i int, host string) {
		key := "bench/" + strings.TrimSuffix(host, ".bench.example")
		a := &table.Action{
			Route:    "HTTPRoute/" + key,
			RuleName: "0",
			Backends: []*table.Backend{{Name: "bench/echo:8080", Weight: 1, Endpoints: backends}},
			Balancer: table.NewWRR([]int32{1}),
		}
		p.Add(host, &table.Rule{Match: table.Match{Path: table.PathMatch{Type: table.PathPrefix, Value: "/"}},
			Action: a, Created: created.Add(time.Duration(i) * time.Second), RouteKey: key})
	}
	for i := range n {
		add(i, Host(i))
	}
	for i, h := range extra {
		add(n+i, h)
	}
	start := time.Now()
	p.Finish()
	return &table.Table{Ports: map[int32]*table.Port{bind: p}, Generation: gen}, time.Since(start)
}

type common struct {
	listen   string
	routes   int
	backends []string
}

func flags(name string, args []string, extra func(*flag.FlagSet)) (*common, error) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	c := &common{}
	var backends string
	fs.StringVar(&c.listen, "listen", "127.0.0.1:8080", "address the proxy listens on")
	fs.IntVar(&c.routes, "routes", 10000, "number of HTTPRoutes")
	fs.StringVar(&backends, "backends", "", "backend endpoints ip:port, comma separated")
	if extra != nil {
		extra(fs)
	}
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if backends != "" {
		c.backends = strings.Split(backends, ",")
	}
	if c.routes < 1 {
		return nil, fmt.Errorf("-routes %d: need at least 1", c.routes)
	}
	return c, nil
}

func splitListen(listen string) (string, int32, error) {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return "", 0, fmt.Errorf("-listen %q: %w", listen, err)
	}
	p, err := strconv.ParseUint(port, 10, 16)
	if err != nil || p == 0 {
		return "", 0, fmt.Errorf("-listen %q: bad port", listen)
	}
	return host, int32(p), nil
}

func serve(args []string) error {
	var metrics bool
	var cpuProfile string
	c, err := flags("serve", args, func(fs *flag.FlagSet) {
		fs.BoolVar(&metrics, "metrics", true, "keep Prometheus metrics on, as flatnet gateway runs")
		fs.StringVar(&cpuProfile, "cpuprofile", "", "write a CPU profile of the whole serving time here")
	})
	if err != nil {
		return err
	}
	if len(c.backends) == 0 {
		return errors.New("serve: -backends is required")
	}
	host, bind, err := splitListen(c.listen)
	if err != nil {
		return err
	}
	o := proxy.Options{BindAddress: host}
	if metrics {
		o.Registry = prometheus.NewRegistry()
	}
	s := proxy.New(o)
	start := time.Now()
	t, _ := buildTable(bind, c.routes, c.backends, 1)
	built := time.Since(start)
	if err := s.Update(t); err != nil {
		return err
	}
	// What the process holds at rest with the table, as a long-running
	// gateway would after its first GC cycles.
	runtime.GC()
	debug.FreeOSMemory()
	fmt.Printf("ready routes=%d build_ms=%.1f rss_kib=%d heap_kib=%d\n", c.routes,
		float64(built.Microseconds())/1000, rssKiB(), heapKiB())
	if cpuProfile != "" {
		f, err := os.Create(cpuProfile)
		if err != nil {
			return err
		}
		if err := pprof.StartCPUProfile(f); err != nil {
			return err
		}
		defer f.Close()
		defer pprof.StopCPUProfile()
	}
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	<-sig
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	return s.Close(ctx)
}

func rssKiB() int {
	b, err := os.ReadFile("/proc/self/status")
	if err != nil {
		return -1
	}
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
			n, _ := strconv.Atoi(f[1])
			return n
		}
	}
	return -1
}

func heapKiB() uint64 {
	var m runtime.MemStats
	runtime.ReadMemStats(&m)
	return m.HeapInuse / 1024
}

func nginxConf(args []string) error {
	var dir string
	c, err := flags("nginx-conf", args, func(fs *flag.FlagSet) {
		fs.StringVar(&dir, "dir", "", "directory for nginx's pid, logs and temp files")
	})
	if err != nil {
		return err
	}
	if dir == "" || len(c.backends) == 0 {
		return errors.New("nginx-conf: -dir and -backends are required")
	}
	w := &strings.Builder{}
	prelude(w, dir)
	fmt.Fprintf(w, "  server_names_hash_max_size %d;\n  server_names_hash_bucket_size 128;\n", 4*c.routes)
	// The equivalent of flatnet's rule: HTTP/1.1 to the upstream over
	// pooled keep-alive connections, the client's Host and X-Forwarded-*
	// as flatnet's proxy sets them.
	w.WriteString("  upstream echo {\n")
	for _, b := range c.backends {
		fmt.Fprintf(w, "    server %s;\n", b)
	}
	w.WriteString("    keepalive 128;\n    keepalive_requests 1000000;\n  }\n")
	w.WriteString(`  proxy_http_version 1.1;
  proxy_set_header Connection "";
  proxy_set_header Host $http_host;
  proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;
  proxy_set_header X-Forwarded-Host $host;
  proxy_set_header X-Forwarded-Proto $scheme;
`)
	fmt.Fprintf(w, "  server {\n    listen %s default_server;\n    return 404;\n  }\n", c.listen)
	for i := range c.routes {
		fmt.Fprintf(w, "  server {\n    listen %s;\n    server_name %s;\n    location / {\n      proxy_pass http://echo;\n    }\n  }\n", c.listen, Host(i))
	}
	w.WriteString("}\n")
	_, err = io.WriteString(os.Stdout, w.String())
	return err
}

// prelude writes what both nginx configurations share: one worker, no
// access log, every file under dir, keep-alive without a request limit.
func prelude(w *strings.Builder, dir string) {
	fmt.Fprintf(w, `worker_processes 1;
daemon off;
pid %[1]s/nginx.pid;
error_log %[1]s/error.log warn;
events {
  worker_connections 8192;
}
http {
  access_log off;
  keepalive_requests 1000000;
  keepalive_timeout 75s;
  client_body_temp_path %[1]s/client_body;
  proxy_temp_path %[1]s/proxy;
  fastcgi_temp_path %[1]s/fastcgi;
  uwsgi_temp_path %[1]s/uwsgi;
  scgi_temp_path %[1]s/scgi;
`, dir)
}

func backendConf(args []string) error {
	fs := flag.NewFlagSet("backend-conf", flag.ContinueOnError)
	listen := fs.String("listen", "", "addresses ip:port, comma separated")
	dir := fs.String("dir", "", "directory for nginx's pid, logs and temp files")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *listen == "" || *dir == "" {
		return errors.New("backend-conf: -listen and -dir are required")
	}
	w := &strings.Builder{}
	prelude(w, *dir)
	w.WriteString("  server {\n")
	for _, l := range strings.Split(*listen, ",") {
		fmt.Fprintf(w, "    listen %s;\n", l)
	}
	fmt.Fprintf(w, "    default_type text/plain;\n    location / {\n      return 200 \"%s\";\n    }\n  }\n}\n",
		strings.Repeat("x", BodySize-1)+"\\n")
	_, err := io.WriteString(os.Stdout, w.String())
	return err
}

func change(args []string) error {
	var changes int
	var routeList string
	c, err := flags("change", args, func(fs *flag.FlagSet) {
		fs.IntVar(&changes, "changes", 100, "route changes per table size")
		fs.StringVar(&routeList, "route-sizes", "", "table sizes, comma separated (default: -routes)")
	})
	if err != nil {
		return err
	}
	if len(c.backends) == 0 || changes < 1 {
		return errors.New("change: -backends and -changes >= 1 are required")
	}
	sizes := []int{c.routes}
	if routeList != "" {
		sizes = nil
		for _, s := range strings.Split(routeList, ",") {
			n, err := strconv.Atoi(s)
			if err != nil || n < 1 {
				return fmt.Errorf("-route-sizes: bad size %q", s)
			}
			sizes = append(sizes, n)
		}
	}
	host, bind, err := splitListen(c.listen)
	if err != nil {
		return err
	}
	client := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 4}, Timeout: 5 * time.Second}
	addr := "http://" + net.JoinHostPort(host, strconv.Itoa(int(bind))) + "/"
	for _, n := range sizes {
		s := proxy.New(proxy.Options{BindAddress: host, Registry: prometheus.NewRegistry()})
		first, _ := buildTable(bind, n, c.backends, 1)
		if err := s.Update(first); err != nil {
			return err
		}
		var total, finish, swap []time.Duration
		probes := 0
		for k := range changes {
			newHost := fmt.Sprintf("new-%d.bench.example", k)
			start := time.Now()
			t, fin := buildTable(bind, n, c.backends, uint64(k+2), newHost)
			finish = append(finish, fin)
			updating := time.Now()
			if err := s.Update(t); err != nil {
				return err
			}
			for {
				probes++
				code, err := get(client, addr, newHost)
				if err == nil && code == http.StatusOK {
					break
				}
				if time.Since(start) > 10*time.Second {
					return fmt.Errorf("%d routes: %s not served 10 s after the change (last: %d %v)", n, newHost, code, err)
				}
			}
			total = append(total, time.Since(start))
			swap = append(swap, time.Since(updating))
		}
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		err := s.Close(ctx)
		cancel()
		if err != nil {
			return err
		}
		client.CloseIdleConnections()
		fmt.Printf("change routes=%d changes=%d probes=%d total_p50_ms=%.2f total_p99_ms=%.2f finish_p50_ms=%.2f finish_p99_ms=%.2f update_p50_ms=%.2f update_p99_ms=%.2f\n",
			n, changes, probes, pct(total, 50), pct(total, 99), pct(finish, 50), pct(finish, 99), pct(swap, 50), pct(swap, 99))
	}
	return nil
}

func get(c *http.Client, url, host string) (int, error) {
	req, err := http.NewRequest("GET", url, nil)
	if err != nil {
		return 0, err
	}
	req.Host = host
	resp, err := c.Do(req)
	if err != nil {
		return 0, err
	}
	io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, nil
}

// pct is the p-th percentile (nearest rank) in milliseconds.
func pct(ds []time.Duration, p int) float64 {
	s := slices.Clone(ds)
	slices.Sort(s)
	i := (len(s)*p + 99) / 100
	if i < 1 {
		i = 1
	}
	return float64(s[i-1].Microseconds()) / 1000
}
