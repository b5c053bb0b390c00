package lab

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/flatnet/flatnet/internal/testutil"
	"golang.org/x/sys/unix"
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

// TestExecPassesNoInheritedFD: a command run by `lab exec` gets stdin,
// stdout and stderr, not an fd its caller inherited without close-on-exec
// (a shell's or flock's), as docker exec and runc's exec do. The command
// runs in this test's own namespaces.
func TestExecPassesNoInheritedFD(t *testing.T) {
	testutil.RequireRoot(t)
	fd, err := unix.Open(filepath.Join(t.TempDir(), "lock"), unix.O_RDWR|unix.O_CREAT, 0o600)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { unix.Close(fd) })
	check := fmt.Sprintf("test ! -e /proc/$$/fd/%d", fd)
	if err := Exec(&ExecTarget{PID: os.Getpid()}, []string{"sh", "-c", check}); err != nil {
		t.Errorf("the command inherited fd %d (%s): %v", fd, check, err)
	}
}
