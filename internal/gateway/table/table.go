// Package table is flatnet gateway's routing table: everything the HTTP
// data plane needs to answer a request, as plain immutable data.
//
// Design. The control plane (internal/gateway/compile) turns Gateways,
// HTTPRoutes, GRPCRoutes, Ingresses, Services, EndpointSlices and Secrets
// into one *Table; the data plane (internal/gateway/proxy) holds the current
// one in an atomic.Pointer and swaps it whole, so a request or stream that
// started on the old table finishes on it and no listener is ever restarted
// for a route change. Nothing here is mutated after Build returns, except
// the balancing state inside Action and Backend, which is safe for
// concurrent use.
//
// One Port is one socket the proxy listens on: one Gateway's listeners that
// share a port (the proxy binds Port.Bind; the Service fronting the Gateway
// maps the listener port to it), or the Ingress port. Inside a Port the
// spec's two hostname decisions (the most specific listener hostname, then
// the most specific route hostname) collapse into one lookup: rules are
// filed under their effective hostname (the intersection of listener and
// route hostnames), exact names first, then wildcards longest suffix
// first, then the rules with no hostname at all; only the rules under the
// most specific hostname that matches the request are considered, which is
// what the spec orders. Within a host, Rules are sorted by the spec's
// precedence (Sort), so the first Rule whose Match matches wins.
package table

import (
	"crypto/tls"
	"regexp"
	"time"
)

// Table is the data plane's whole configuration.
type Table struct {
	// Ports by the port the proxy binds.
	Ports map[int32]*Port
	// Generation counts Builds, for logs and metrics.
	Generation uint64
}

// Protocol of a Port.
type Protocol string

const (
	HTTP  Protocol = "HTTP"
	HTTPS Protocol = "HTTPS"
)

// Port is one listening socket and the routes behind it.
type Port struct {
	// Bind is the port the proxy listens on; Listen the Gateway listener's
	// port clients use (redirects keep it when they keep the scheme).
	Bind     int32
	Listen   int32
	Protocol Protocol
	// Certs are the HTTPS certificates by SNI (see Port.Certificate).
	Certs []Cert
	// Gateway is "namespace/name" of the Gateway this port serves
	// ("" for Ingress), for metrics and logs.
	Gateway string

	// Exact hostnames (lower case) to their rules.
	Exact map[string]*Host
	// Wildcards ("*.example.com"), longest suffix first.
	Wildcards []*Host
	// Any holds the rules with no hostname; nil when there are none.
	Any *Host

	wild map[string]*Host // Wildcards by suffix (".example.com"), built by Finish
}

// Cert is one listener's certificate: Hostname is the listener's
// hostname ("" for any, "*.example.com" for a wildcard).
type Cert struct {
	Hostname string
	Cert     *tls.Certificate
}

// Host is the rules under one effective hostname, in precedence order.
type Host struct {
	Name  string
	Rules []*Rule

	index *ruleIndex // built by Finish for hosts with many rules
}

// Rule is one match of one route rule (a route rule with three matches
// becomes three Rules sharing one Action).
type Rule struct {
	Match  Match
	Action *Action
	// Sort keys the compiler fills for precedence (Sort): the route's
	// creation time and namespace/name, and the rule's and match's index
	// in it.
	Created    time.Time
	RouteKey   string
	RuleIndex  int
	MatchIndex int
}

// PathType of a path match.
type PathType string

const (
	PathExact  PathType = "Exact"
	PathPrefix PathType = "PathPrefix"
	PathRegex  PathType = "RegularExpression"
)

// Match is one HTTPRouteMatch (GRPCRoute method matches are compiled to
// path matches on /service/method).
type Match struct {
	Path PathMatch
	// Method is empty for any.
	Method  string
	Headers []ValueMatch
	Query   []ValueMatch
}

// PathMatch: Value is "/" with PathPrefix when the route gave no match.
type PathMatch struct {
	Type   PathType
	Value  string
	Regexp *regexp.Regexp // set for PathRegex
}

// ValueMatch is a header or query parameter match. Header names are
// canonical (textproto.CanonicalMIMEHeaderKey), query names as given.
type ValueMatch struct {
	Name   string
	Value  string
	Regexp *regexp.Regexp // set for RegularExpression, else exact
}

// Action is what a matched rule does. Exactly one of Redirect, Direct or
// Backends decides the answer.
type Action struct {
	// Route is "kind/namespace/name" and RuleName the rule's name or its
	// index, for metrics and access logs.
	Route    string
	RuleName string

	RequestHeaders  HeaderFilter
	ResponseHeaders HeaderFilter
	Redirect        *Redirect
	Rewrite         *Rewrite
	Mirrors         []*Mirror

	// Direct, when not 0, answers with that status and no backend (500
	// for a rule whose backends are all invalid, 404 for none).
	Direct int

	// Backends with their weights, picked by Balancer; a Backend with
	// Invalid set answers 500 for its share, as the spec wants.
	Backends []*Backend
	Balancer *WRR

	// Timeout bounds the whole request (HTTPRouteTimeouts.Request),
	// BackendTimeout each try (BackendRequest); 0 means none.
	Timeout        time.Duration
	BackendTimeout time.Duration
	Retry          *Retry

	// GRPC marks a GRPCRoute rule: errors are answered as gRPC statuses.
	GRPC bool
}

// HeaderFilter is a RequestHeaderModifier or ResponseHeaderModifier with
// canonical names.
type HeaderFilter struct {
	Set    []Header
	Add    []Header
	Remove []string
}

// Header is a name and a value.
type Header struct {
	Name, Value string
}

// Empty reports whether the filter changes nothing.
func (f HeaderFilter) Empty() bool {
	return len(f.Set) == 0 && len(f.Add) == 0 && len(f.Remove) == 0
}

// PathModifier is ReplaceFullPath or ReplacePrefixMatch; Prefix is the
// matched prefix that ReplacePrefixMatch replaces.
type PathModifier struct {
	Full          string // ReplaceFullPath when FullSet
	FullSet       bool
	ReplacePrefix string // ReplacePrefixMatch
	Prefix        string
}

// Redirect is a RequestRedirect filter; empty fields keep the request's.
type Redirect struct {
	Scheme     string
	Hostname   string
	Port       int32 // 0 keeps the default for the scheme, as the spec says
	Path       *PathModifier
	StatusCode int // 301 or 302
}

// Rewrite is a URLRewrite filter.
type Rewrite struct {
	Hostname string
	Path     *PathModifier
}

// Mirror is a RequestMirror filter: a copy of the request goes to
// Backend and its answer is dropped. Percent is 0-100.
type Mirror struct {
	Backend *Backend
	Percent float64
}

// Retry is HTTPRouteRetry: Codes retried up to Attempts more times,
// waiting Backoff between tries.
type Retry struct {
	Codes    []int
	Attempts int
	Backoff  time.Duration
}

// AppProtocol of a backend port.
type AppProtocol string

const (
	HTTP1 AppProtocol = ""                  // HTTP/1.1 (with upgrades)
	H2C   AppProtocol = "kubernetes.io/h2c" // HTTP/2 prior knowledge
	WS    AppProtocol = "kubernetes.io/ws"  // WebSocket (HTTP/1.1 upgrade)
)

// Backend is one backendRef: a Service port and its ready endpoints.
type Backend struct {
	// Name is "namespace/service:port" for metrics and logs.
	Name     string
	Weight   int32
	Protocol AppProtocol
	// Invalid makes this backend's share answer 500 (a ref to a missing
	// Service, a kind that is not supported, a cross-namespace ref no
	// ReferenceGrant allows).
	Invalid bool
	// Endpoints are "ip:port" of ready endpoints (serving-terminating ones
	// only when no ready one is left), in a stable order.
	Endpoints []string
	// Filters of the backendRef itself.
	RequestHeaders  HeaderFilter
	ResponseHeaders HeaderFilter

	next uint64 // round robin over Endpoints (atomic)
}
