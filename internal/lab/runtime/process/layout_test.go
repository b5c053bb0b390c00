package process

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	v1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// The pod's state files are readable by root only (they were 0644).
func TestStateFilesArePrivate(t *testing.T) {
	pod := &v1.Pod{
		ObjectMeta: metav1.ObjectMeta{Namespace: "app", Name: "p", UID: "u1"},
		Spec:       v1.PodSpec{Containers: []v1.Container{{Name: "c"}}},
	}
	rec := newRecord(pod, time.Now())
	rec.Netns = "fntp-u1"
	rec.Containers[0].Proc = &procID{PID: 4242, StartTicks: 1, MntNS: 2}
	dir := podDir(t.TempDir(), "app", "p")
	if err := rec.save(dir); err != nil {
		t.Fatal(err)
	}
	for _, f := range []string{"state.json", "netns", filepath.Join("containers", "c", "pid")} {
		st, err := os.Stat(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		if st.Mode().Perm() != 0o600 {
			t.Errorf("%s has mode %v, want 0600", f, st.Mode().Perm())
		}
	}
}
