package main

import (
	"errors"
	"flag"
	"fmt"
	"strings"
	"time"

	"github.com/miekg/dns"
)

// check is one query and what its answer must be.
type check struct {
	name  string
	qtype uint16
	rcode int
	// cname, when set, must be the first answer's target (autopath's
	// answer to a first search try); a is whether an A must follow.
	cname string
	a     bool
}

// checks are what a server must answer before it is measured: the first
// and last Service (its informers have synced), an external name through
// the upstream, a name under the cluster zone that matches nothing, and
// autopath's CNAMEs (when on) or their absence (when off).
func checks(nss, svcs int, autopath bool) []check {
	first := svcName(0, 0) + ".svc." + zone + "."
	last := svcName(svcs-1, nss-1) + ".svc." + zone + "."
	other := svcName(0, 1)
	cs := []check{
		{name: last, qtype: dns.TypeA, rcode: dns.RcodeSuccess, a: true},
		{name: first, qtype: dns.TypeA, rcode: dns.RcodeSuccess, a: true},
		{name: first, qtype: dns.TypeAAAA, rcode: dns.RcodeSuccess},
		{name: extName(1) + ".", qtype: dns.TypeA, rcode: dns.RcodeSuccess, a: true},
		{name: external + "." + zone + ".", qtype: dns.TypeA, rcode: dns.RcodeNameError},
	}
	try1 := func(n string) string { return n + "." + clientNS + ".svc." + zone + "." }
	if autopath {
		return append(cs,
			check{name: try1(other), qtype: dns.TypeA, rcode: dns.RcodeSuccess, cname: other + ".svc." + zone + ".", a: true},
			check{name: try1(extName(1)), qtype: dns.TypeA, rcode: dns.RcodeSuccess, cname: extName(1) + ".", a: true})
	}
	return append(cs, check{name: try1(other), qtype: dns.TypeA, rcode: dns.RcodeNameError})
}

func (c check) run(client *dns.Client, server string) error {
	m := new(dns.Msg)
	m.SetQuestion(c.name, c.qtype)
	r, _, err := client.Exchange(m, server)
	if err != nil {
		return fmt.Errorf("%s %s: %w", c.name, dns.TypeToString[c.qtype], err)
	}
	bad := func(why string) error {
		return fmt.Errorf("%s %s: %s; answer:\n%s", c.name, dns.TypeToString[c.qtype], why, r)
	}
	if r.Rcode != c.rcode {
		return bad("rcode " + dns.RcodeToString[r.Rcode] + ", want " + dns.RcodeToString[c.rcode])
	}
	ans := r.Answer
	if c.cname != "" {
		cn, ok := first(ans).(*dns.CNAME)
		if !ok || !strings.EqualFold(cn.Target, c.cname) {
			return bad("want a CNAME to " + c.cname + " first (autopath)")
		}
		ans = ans[1:]
	}
	if _, ok := first(ans).(*dns.A); ok != c.a {
		return bad(fmt.Sprintf("A record present: %v, want %v", ok, c.a))
	}
	return nil
}

func first(rrs []dns.RR) dns.RR {
	if len(rrs) == 0 {
		return nil
	}
	return rrs[0]
}

// readyCmd waits until every check passes at once, from 127.0.0.1 (the
// client Pod's address), and prints how long that took.
func readyCmd(args []string) error {
	fs := flag.NewFlagSet("ready", flag.ExitOnError)
	server := fs.String("server", "", "the server, 127.0.0.1:PORT")
	nss := fs.Int("namespaces", 100, "namespaces ns0..")
	svcs := fs.Int("services", 100, "Services per namespace svc0..")
	autopath := fs.Bool("autopath", false, "the server runs autopath")
	timeout := fs.Duration("timeout", 3*time.Minute, "longest wait")
	_ = fs.Parse(args)
	client := &dns.Client{Timeout: time.Second}
	t0 := time.Now()
	for {
		var err error
		for _, c := range checks(*nss, *svcs, *autopath) {
			if err = c.run(client, *server); err != nil {
				break
			}
		}
		if err == nil {
			fmt.Printf("%.1f\n", time.Since(t0).Seconds())
			return nil
		}
		if time.Since(t0) > *timeout {
			return errors.Join(fmt.Errorf("server %s not ready after %v", *server, *timeout), err)
		}
		time.Sleep(250 * time.Millisecond)
	}
}
