package proxy

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/flatnet/flatnet/internal/gateway/table"
)

// FuzzAppendJSON: every access log field, whatever the client sent, is a
// valid JSON string.
func FuzzAppendJSON(f *testing.F) {
	for _, s := range []string{"", "plain", "\"\\\x00\x1f\x7f", "ünï", "\xff\xfe", "\u2028"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		b := appendJSON(nil, s)
		var got string
		if err := json.Unmarshal(b, &got); err != nil {
			t.Fatalf("%q gave %s: %v", s, b, err)
		}
		if want := strings.ToValidUTF8(s, "\ufffd"); got != want && strings.ToValidUTF8(s, "") == s {
			t.Fatalf("%q came back as %q", s, got)
		}
	})
}

// FuzzModifyPath: a prefix replacement of a path that has the prefix
// keeps a path a path (it starts with "/") and keeps the rest of it.
func FuzzModifyPath(f *testing.F) {
	f.Add("/prefix/one/two", "/prefix/one", "/one")
	f.Add("/strip", "/strip", "/")
	f.Add("/", "/", "")
	f.Fuzz(func(t *testing.T, path, prefix, repl string) {
		if !strings.HasPrefix(path, "/") || !strings.HasPrefix(prefix, "/") || !strings.HasPrefix(repl, "/") {
			return
		}
		got := modifyPath(path, &table.PathModifier{Prefix: prefix, ReplacePrefix: repl})
		if !strings.HasPrefix(got, "/") {
			t.Fatalf("%q with %q -> %q gave %q", path, prefix, repl, got)
		}
		p := strings.TrimSuffix(prefix, "/")
		if rest, ok := strings.CutPrefix(path, p); ok && !strings.HasSuffix(got, strings.TrimPrefix(rest, "/")) {
			t.Fatalf("%q with %q -> %q gave %q, losing %q", path, prefix, repl, got, rest)
		}
	})
}
