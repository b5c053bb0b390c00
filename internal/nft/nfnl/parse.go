package nfnl

// The text form of a knftables.Transaction, read back into commands.
// knftables keeps a transaction's operations unexported; its String() is
// one command a line, written by a handful of Fprintf templates
// (knftables objects.go), so this reader follows those templates and
// nothing more: "<verb> <type> <family> <table> <name> [{ ... }|rule]".

import (
	"strconv"
	"strings"
)

// command is one line of a transaction.
type command struct {
	line       string
	verb       string // add, create, flush, delete
	typ        string // table, chain, rule, set, map, element
	family     string
	table      string
	name       string // chain, set or map name; rule: its chain
	body       string // inside { } for objects and elements; the rule text
	comment    *string
	commentSet bool
}

// eachLine calls f with each non-empty line of tx text, in order, and
// stops at f's first error. Lines are read in place (no slice of them or
// of their commands: a full sync at 10,000 Services is a quarter of a
// million lines).
func eachLine(text string, f func(line string) error) error {
	for len(text) > 0 {
		line := text
		if i := strings.IndexByte(text, '\n'); i >= 0 {
			line, text = text[:i], text[i+1:]
		} else {
			text = ""
		}
		if line == "" {
			continue
		}
		if err := f(line); err != nil {
			return err
		}
	}
	return nil
}

func parseLine(line string) (command, error) {
	c := command{line: line}
	f := strings.SplitN(line, " ", 5)
	if len(f) < 4 {
		return c, unsupported("command %q", line)
	}
	c.verb, c.typ, c.family, c.table = f[0], f[1], f[2], f[3]
	switch c.verb {
	case "add", "create", "flush", "delete":
	default:
		return c, unsupported("command %q", line)
	}
	rest := ""
	if len(f) == 5 {
		rest = f[4]
	}
	if c.typ == "table" {
		if strings.HasPrefix(c.table, "handle") {
			return c, unsupported("command %q", line)
		}
		// "add table ip t { comment "x" ; }"
		if rest != "" {
			body, ok := braced(rest)
			if !ok {
				return c, unsupported("command %q", line)
			}
			c.body = body
		}
		return c, nil
	}
	name, rest, _ := strings.Cut(rest, " ")
	if name == "" || name == "handle" {
		return c, unsupported("command %q", line)
	}
	c.name = name
	switch c.typ {
	case "rule":
		if c.verb == "delete" {
			// "delete rule FAMILY TABLE CHAIN handle N"
			h, ok := strings.CutPrefix(rest, "handle ")
			if _, err := strconv.ParseUint(h, 10, 64); !ok || err != nil {
				return c, unsupported("command %q", line)
			}
			c.body = h
			return c, nil
		}
		if c.verb == "flush" || strings.HasPrefix(rest, "index ") || strings.HasPrefix(rest, "handle ") {
			return c, unsupported("command %q", line)
		}
		c.body = rest
		// knftables appends ` comment "..."` (%q) after the rule text.
		if i := strings.LastIndex(rest, ` comment "`); i >= 0 && strings.HasSuffix(rest, `"`) {
			if s, err := strconv.Unquote(rest[i+len(" comment "):]); err == nil {
				c.body, c.comment = rest[:i], &s
			}
		}
	case "chain", "set", "map", "element":
		if rest != "" {
			body, ok := braced(rest)
			if !ok {
				return c, unsupported("command %q", line)
			}
			c.body = body
		} else if c.typ == "element" {
			return c, unsupported("command %q", line)
		}
	default:
		return c, unsupported("command %q", line)
	}
	return c, nil
}

// braced returns what is between "{ " and " }".
func braced(s string) (string, bool) {
	if !strings.HasPrefix(s, "{") || !strings.HasSuffix(s, "}") {
		return "", false
	}
	return strings.TrimSpace(s[1 : len(s)-1]), true
}

// properties splits an object body "type x ; flags a,b ; comment "c" ;"
// into key -> value.
func properties(body string) (map[string]string, error) {
	out := map[string]string{}
	for body = strings.TrimSpace(body); body != ""; body = strings.TrimSpace(body) {
		var item string
		if strings.HasPrefix(body, "comment ") {
			q, err := strconv.QuotedPrefix(body[len("comment "):])
			if err != nil {
				return nil, unsupported("object body %q", body)
			}
			s, _ := strconv.Unquote(q)
			out["comment"] = s
			body = strings.TrimSpace(body[len("comment ")+len(q):])
			body = strings.TrimPrefix(body, ";")
			continue
		}
		item, body, _ = strings.Cut(body, ";")
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		k, v, _ := strings.Cut(item, " ")
		if _, dup := out[k]; dup {
			return nil, unsupported("object body %q", item)
		}
		out[k] = strings.TrimSpace(v)
	}
	return out, nil
}

// tokens splits rule text on spaces, keeping quoted strings whole.
func tokens(s string) ([]string, error) {
	var out []string
	for s = strings.TrimSpace(s); s != ""; s = strings.TrimSpace(s) {
		if s[0] == '"' {
			q, err := strconv.QuotedPrefix(s)
			if err != nil {
				return nil, unsupported("quoted string in %q", s)
			}
			out = append(out, q)
			s = s[len(q):]
			continue
		}
		tok, rest, _ := strings.Cut(s, " ")
		out = append(out, tok)
		s = rest
	}
	return out, nil
}
