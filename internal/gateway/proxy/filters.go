package proxy

import (
	"net/http"
	"strconv"
	"strings"

	"github.com/flatnet/flatnet/internal/gateway/table"
)

// applyHeaders applies a header modifier: set replaces, add appends,
// remove deletes (names are canonical already).
func applyHeaders(h http.Header, f *table.HeaderFilter) {
	for _, x := range f.Set {
		h[x.Name] = []string{x.Value}
	}
	for _, x := range f.Add {
		h[x.Name] = append(h[x.Name], x.Value)
	}
	for _, n := range f.Remove {
		delete(h, n)
	}
}

// redirect answers with a RequestRedirect filter's Location. Empty fields
// keep the request's; the port follows HTTPRequestRedirectFilter: the
// filter's, else the well-known port of a scheme the filter sets, else the
// listener's; 80 for http and 443 for https are left out.
func redirect(w http.ResponseWriter, r *http.Request, p *table.Port, rd *table.Redirect) {
	scheme := rd.Scheme
	if scheme == "" {
		scheme = "http"
		if p.Protocol == table.HTTPS {
			scheme = "https"
		}
	}
	host := rd.Hostname
	if host == "" {
		host = hostOnly(r.Host)
	}
	port := rd.Port
	if port == 0 {
		port = p.Listen
		if rd.Scheme != "" {
			switch scheme {
			case "http":
				port = 80
			case "https":
				port = 443
			}
		}
	}
	path := r.URL.EscapedPath()
	if rd.Path != nil {
		path = modifyPath(r.URL.Path, rd.Path)
	}

	b := make([]byte, 0, len(scheme)+len(host)+len(path)+len(r.URL.RawQuery)+16)
	b = append(b, scheme...)
	b = append(b, "://"...)
	ipv6 := strings.IndexByte(host, ':') >= 0
	if ipv6 {
		b = append(b, '[')
	}
	b = append(b, host...)
	if ipv6 {
		b = append(b, ']')
	}
	if port != 0 && !(scheme == "http" && port == 80) && !(scheme == "https" && port == 443) {
		b = append(b, ':')
		b = strconv.AppendInt(b, int64(port), 10)
	}
	b = append(b, path...)
	if r.URL.RawQuery != "" {
		b = append(b, '?')
		b = append(b, r.URL.RawQuery...)
	}
	code := rd.StatusCode
	if code == 0 {
		code = http.StatusFound
	}
	w.Header()["Location"] = []string{string(b)}
	w.WriteHeader(code)
}

// modifyPath applies ReplaceFullPath or ReplacePrefixMatch to path.
// The prefix is matched by path elements, so "/foo" replaced by "/bar"
// turns "/foo/x" into "/bar/x" and "/foo" into "/bar"; replaced by "/" it
// turns "/foo/x" into "/x" and "/foo" into "/".
func modifyPath(path string, m *table.PathModifier) string {
	if m.FullSet {
		return m.Full
	}
	prefix := strings.TrimSuffix(m.Prefix, "/")
	rest := path
	if strings.HasPrefix(path, prefix) {
		rest = path[len(prefix):]
	}
	repl := strings.TrimSuffix(m.ReplacePrefix, "/")
	switch {
	case rest == "":
		if repl == "" {
			return "/"
		}
		return repl
	case rest[0] != '/':
		return repl + "/" + rest
	default:
		return repl + rest
	}
}

// isGRPC reports whether r is a gRPC call (its answers must be gRPC
// statuses even when no GRPCRoute matched).
func isGRPC(r *http.Request) bool {
	ct := r.Header["Content-Type"]
	return len(ct) > 0 && strings.HasPrefix(ct[0], "application/grpc")
}

// gRPC status codes the proxy answers with (google.golang.org/grpc/codes).
const (
	grpcDeadlineExceeded = 4
	grpcPermissionDenied = 7
	grpcUnimplemented    = 12
	grpcInternal         = 13
	grpcUnavailable      = 14
	grpcUnauthenticated  = 16
	grpcUnknown          = 2
)

// grpcCode maps an HTTP status the proxy would answer to the gRPC code a
// client expects for it (gRPC's "HTTP to gRPC status code mapping", with
// 504 as a deadline).
func grpcCode(code int) int {
	switch code {
	case http.StatusBadRequest, http.StatusInternalServerError:
		return grpcInternal
	case http.StatusUnauthorized:
		return grpcUnauthenticated
	case http.StatusForbidden:
		return grpcPermissionDenied
	case http.StatusNotFound:
		return grpcUnimplemented
	case http.StatusTooManyRequests, http.StatusBadGateway, http.StatusServiceUnavailable:
		return grpcUnavailable
	case http.StatusGatewayTimeout:
		return grpcDeadlineExceeded
	}
	return grpcUnknown
}

var grpcContentType = []string{"application/grpc"}

// writeGRPCStatus answers trailers-only: HTTP 200 whose headers carry
// grpc-status and grpc-message, and no body.
func writeGRPCStatus(w http.ResponseWriter, code int) {
	h := w.Header()
	h["Content-Type"] = grpcContentType
	h["Grpc-Status"] = []string{strconv.Itoa(grpcCode(code))}
	h["Grpc-Message"] = []string{strings.ReplaceAll(http.StatusText(code), " ", "%20")}
	w.WriteHeader(http.StatusOK)
}
