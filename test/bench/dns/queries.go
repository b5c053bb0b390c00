package main

import (
	"bufio"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
)

const (
	zone      = "cluster.local"
	clientNS  = "ns0"         // the namespace of the Pod at 127.0.0.1: the autopath client's
	external  = "example.com" // the upstream's zone (a CoreDNS template in the script)
	externals = 1000          // distinct external names hK.example.com
)

// A benchCase is one query file and how to read its figures.
type benchCase struct {
	ID, What string
	// PerName is queries per name resolved, to turn QPS into names/s.
	PerName float64
	// Want is the rcodes every answer must have; anything else is counted
	// as unexpected and fails the run (a server answering SERVFAIL fast
	// is not a result).
	Want []string
	// Autopath: run against the servers started with autopath on.
	Autopath bool
	write    func(w *bufio.Writer, r *rand.Rand, namespaces, services int)
}

func svcName(svc, ns int) string { return fmt.Sprintf("svc%d.ns%d", svc, ns) }

func extName(k int) string { return fmt.Sprintf("h%d.%s", k, external) }

// The cases, in report order. (a)-(c) are the anchor's query files
// (docs/research/coredns-anchor.md), (d) the search path of a pod in ns0
// with and without autopath, (e) the forwarder's cache.
var cases = []benchCase{
	{ID: "a", What: "cluster names svc.ns.svc.cluster.local, A", PerName: 1, Want: []string{"NOERROR"},
		write: func(w *bufio.Writer, r *rand.Rand, nss, svcs int) {
			for _, i := range r.Perm(nss * svcs) {
				fmt.Fprintf(w, "%s.svc.%s A\n", svcName(i%svcs, i/svcs), zone)
			}
		}},
	{ID: "b", What: "search try 1 from the Service's namespace, A+AAAA pair (AAAA: NODATA)", PerName: 2, Want: []string{"NOERROR"},
		write: func(w *bufio.Writer, r *rand.Rand, nss, svcs int) {
			for _, i := range r.Perm(nss * svcs) {
				n := svcName(i%svcs, i/svcs)
				fmt.Fprintf(w, "%s.svc.%s A\n%s.svc.%s AAAA\n", n, zone, n, zone)
			}
		}},
	{ID: "c", What: "external name through the 3 cluster suffixes, NXDOMAIN each", PerName: 3, Want: []string{"NXDOMAIN"},
		write: func(w *bufio.Writer, r *rand.Rand, nss, _ int) {
			for range 3334 {
				fmt.Fprintf(w, "%s.ns%d.svc.%s A\n%s.svc.%s A\n%s.%s A\n", external, r.IntN(nss), zone, external, zone, external, zone)
			}
		}},
	{ID: "d-search", What: "from a pod in ns0, no autopath: svc.other-ns (2 tries) and hK.example.com (4 tries), whole search path", PerName: 3,
		Want: []string{"NOERROR", "NXDOMAIN"},
		write: func(w *bufio.Writer, r *rand.Rand, nss, svcs int) {
			for _, n := range searchNames(r, nss, svcs) {
				for _, s := range searchPath(n) {
					fmt.Fprintf(w, "%s A\n", s)
				}
			}
		}},
	{ID: "d-autopath", What: "the same names, autopath on: first try only, answered in one round trip (CNAME + A)", PerName: 1,
		Want: []string{"NOERROR"}, Autopath: true,
		write: func(w *bufio.Writer, r *rand.Rand, nss, svcs int) {
			for _, n := range searchNames(r, nss, svcs) {
				fmt.Fprintf(w, "%s A\n", searchPath(n)[0])
			}
		}},
	{ID: "e", What: "external names hK.example.com, forwarded once, then cached", PerName: 1, Want: []string{"NOERROR"},
		write: func(w *bufio.Writer, r *rand.Rand, _, _ int) {
			for _, k := range r.Perm(externals) {
				fmt.Fprintf(w, "%s A\n", extName(k))
			}
		}},
}

// searchNames are what a pod in clientNS looks up in case (d): each
// external name once and as many Services of other namespaces, shuffled.
type searchName struct {
	name     string
	external bool
}

func searchNames(r *rand.Rand, nss, svcs int) []searchName {
	var names []searchName
	for k := range externals {
		names = append(names, searchName{extName(k), true})
		names = append(names, searchName{svcName(r.IntN(svcs), 1+r.IntN(nss-1)), false})
	}
	r.Shuffle(len(names), func(i, j int) { names[i], names[j] = names[j], names[i] })
	return names
}

// searchPath is the queries glibc sends for n from a ClusterFirst pod in
// clientNS (ndots:5, search ns0.svc.zone svc.zone zone), up to the first
// that answers: a Service in another namespace answers at svc.zone, an
// external name only as itself.
func searchPath(n searchName) []string {
	path := []string{n.name + "." + clientNS + ".svc." + zone, n.name + ".svc." + zone}
	if n.external {
		path = append(path, n.name+"."+zone, n.name+".")
	}
	return path
}

func caseByID(id string) (benchCase, bool) {
	i := slices.IndexFunc(cases, func(c benchCase) bool { return c.ID == id })
	if i < 0 {
		return benchCase{}, false
	}
	return cases[i], true
}

// queriesCmd writes DIR/<case>.txt for every case and prints "ID base" or
// "ID autopath" a line, which servers run it, for the script's loops.
func queriesCmd(args []string) error {
	fs := flag.NewFlagSet("queries", flag.ExitOnError)
	dir := fs.String("dir", "", "directory for the query files")
	nss := fs.Int("namespaces", 100, "namespaces ns0..")
	svcs := fs.Int("services", 100, "Services per namespace svc0..")
	_ = fs.Parse(args)
	if *dir == "" || *nss < 2 || *svcs < 1 {
		return fmt.Errorf("queries: need -dir, -namespaces >= 2 and -services >= 1")
	}
	for _, c := range cases {
		// Seeded by the case's letter: d-search and d-autopath ask for
		// the same names; every run writes the same files.
		r := rand.New(rand.NewPCG(1, uint64(c.ID[0])))
		if err := writeCase(filepath.Join(*dir, c.ID+".txt"), c, r, *nss, *svcs); err != nil {
			return err
		}
		kind := "base"
		if c.Autopath {
			kind = "autopath"
		}
		fmt.Println(c.ID, kind)
	}
	return nil
}

func writeCase(path string, c benchCase, r *rand.Rand, nss, svcs int) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("query file: %w", err)
	}
	w := bufio.NewWriter(f)
	c.write(w, r, nss, svcs)
	if err := w.Flush(); err != nil {
		f.Close()
		return fmt.Errorf("query file %s: %w", path, err)
	}
	return f.Close()
}
