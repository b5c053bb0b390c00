package hostlocal_test

import (
	"fmt"
	"testing"

	"github.com/flatnet/flatnet/internal/cni/hostlocal"
)

// BenchmarkAddDel measures one in-process ADD+DEL on a dataDir that
// already holds 100 reservations (what bridge pays per pod when
// host-local runs in its process).
func BenchmarkAddDel(b *testing.B) {
	dd := b.TempDir()
	c := []byte(fmt.Sprintf(`{"cniVersion":"1.1.0","name":"testnet","ipam":{"type":"host-local","dataDir":%q,"ranges":[[{"subnet":"10.87.0.0/16"}]]}}`, dd))
	for i := 0; i < 100; i++ {
		if _, err := hostlocal.Add(cmdArgs(c, fmt.Sprint("base", i), "eth0")); err != nil {
			b.Fatal(err)
		}
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := hostlocal.Add(cmdArgs(c, "pod", "eth0")); err != nil {
			b.Fatal(err)
		}
		if err := hostlocal.Del(cmdArgs(c, "pod", "eth0")); err != nil {
			b.Fatal(err)
		}
	}
}
