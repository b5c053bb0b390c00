package lab

import (
	"context"
	"strings"
	"testing"
)

// TestFindContainerRefusesBadNames: names that are not valid Kubernetes
// names never reach the runtime's paths; the error names the bad part and
// the rule, and a lab with a pod of that shape cannot be reached.
func TestFindContainerRefusesBadNames(t *testing.T) {
	root := t.TempDir()
	o := opts("ex", 1)
	o.StateRoot = root
	s, err := NewSpec(o, DefaultUnderlay("ex"))
	if err != nil {
		t.Fatal(err)
	}
	if err := saveRecord(&record{Spec: *s}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		namespace, pod, container string
		want                      string
	}{
		{"default", "../../../etc", "", `invalid pod name "../../../etc"`},
		{"default", "a/b", "", `invalid pod name "a/b"`},
		{"..", "web", "", `invalid namespace name ".."`},
		{"kube/system", "web", "", `invalid namespace name "kube/system"`},
		{"", "web", "", `invalid namespace name ""`},
		{"default", "", "", `invalid pod name ""`},
		{"default", "web", "../c", `invalid container name "../c"`},
		{"default", "Web", "", `invalid pod name "Web": a lowercase RFC 1123 subdomain`},
		{"default", strings.Repeat("a", 254), "", "must be no more than 253 characters"},
	} {
		_, err := FindContainer(context.Background(), root, "ex", c.namespace, c.pod, c.container)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("FindContainer(%q, %q, %q): %v; want an error containing %q", c.namespace, c.pod, c.container, err, c.want)
		}
	}
	// Valid names get past validation (to the runtime state: no such pod).
	if _, err := FindContainer(context.Background(), root, "ex", "kube-system", "web-0.a", "c1"); err == nil || !strings.Contains(err.Error(), "no pod kube-system/web-0.a") {
		t.Errorf("valid names: %v", err)
	}
}
