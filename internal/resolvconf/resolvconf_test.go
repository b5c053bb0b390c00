package resolvconf

import (
	"reflect"
	"testing"
)

func TestParse(t *testing.T) {
	got := Parse([]byte("# comment\nnameserver 10.0.0.2\nsearch a.example. b\ndomain ignored.example\nnameserver 10.0.0.3\nsearch c.example. d\noptions ndots:2 edns0\n;x\nnameserver\n"))
	want := File{Nameservers: []string{"10.0.0.2", "10.0.0.3"}, Searches: []string{"c.example", "d"}, Options: []string{"ndots:2", "edns0"}}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Parse = %+v, want %+v", got, want)
	}
	if got := Parse(nil); !reflect.DeepEqual(got, File{}) {
		t.Errorf("Parse(nil) = %+v", got)
	}
}
