package mountinfo

import (
	"strings"
	"testing"
)

func FuzzUnescape(f *testing.F) {
	f.Add(`/var/lib/a\040b`)
	f.Add(`\`)
	f.Add(`\12`)
	f.Fuzz(func(t *testing.T, s string) {
		_ = Unescape(s)
	})
}

func TestUnescape(t *testing.T) {
	if got := Unescape(`/a\040b\134c`); got != `/a b\c` {
		t.Errorf("got %q", got)
	}
}

func TestUnder(t *testing.T) {
	table := `27 1 254:0 / / rw - ext4 /dev/vda rw
50 27 254:0 /s/run /s/n1/run rw - ext4 /dev/vda rw
51 50 0:4 mnt:[4026532] /s/n1/run/mnt rw - nsfs nsfs rw
52 27 254:0 /s/n10 /s/n10 rw - ext4 /dev/vda rw
53 27 0:40 / /s/n1/a\040b rw - tmpfs tmpfs rw
54 53 0:41 / /s/n1/a\040b rw - tmpfs tmpfs rw
`
	got := strings.Join(under(table, "/s/n1"), ",")
	if want := "/s/n1/run/mnt,/s/n1/a b,/s/n1/a b,/s/n1/run"; got != want {
		t.Errorf("under = %s, want %s", got, want)
	}
}
