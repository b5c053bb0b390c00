package testutil

import (
	"strings"
	"testing"
)

// Wire joins namespaces a and b (paths from NewNetNS) with a veth pair:
// nameA in a with addrsA, nameB in b with addrsB ("ip/len"; IPv6 without
// duplicate address detection, so usable at once), both ends up. The pair
// goes when either namespace is removed.
func Wire(t testing.TB, a, nameA string, addrsA []string, b, nameB string, addrsB []string) {
	t.Helper()
	Run(t, "ip", "-n", NSName(a), "link", "add", nameA, "type", "veth", "peer", "name", nameB, "netns", NSName(b))
	for _, end := range []struct {
		ns, name string
		addrs    []string
	}{{a, nameA, addrsA}, {b, nameB, addrsB}} {
		for _, addr := range end.addrs {
			argv := []string{"ip", "-n", NSName(end.ns), "addr", "add", addr, "dev", end.name}
			if strings.Contains(addr, ":") {
				argv = append(argv, "nodad")
			}
			Run(t, argv...)
		}
		Run(t, "ip", "-n", NSName(end.ns), "link", "set", end.name, "up")
	}
}
