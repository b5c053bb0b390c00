package nft

// Reads. Every read is one `nft -j list table`: ListTable adds --terse
// (no set and map elements, which it does not need); the knftables.Interface
// calls read the full table, since ListElements needs the elements.

import (
	"context"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"syscall"

	"sigs.k8s.io/knftables"
)

// list returns `nft -j [--terse] list table` output, or nil when the table
// does not exist.
func (r *Runner) list(ctx context.Context, terse bool) ([]byte, error) {
	args := []string{"-j", "list", "table", string(r.family), r.table}
	if terse {
		args = append([]string{"-j", "--terse"}, args[1:]...)
	}
	out, err := r.exec(ctx, "", args...)
	if IsNotFound(err) {
		return nil, nil
	}
	return out, err
}

// ListTable implements Interface.
func (r *Runner) ListTable(ctx context.Context) (*Table, error) {
	out, err := r.list(ctx, true)
	if out == nil || err != nil {
		return nil, err
	}
	return ParseTableJSON(out)
}

// objects returns the objects of the table, grouped by type ("chain",
// "map", "rule"...). A missing table yields no objects.
func (r *Runner) objects(ctx context.Context) (map[string][]json.RawMessage, error) {
	out, err := r.list(ctx, false)
	if out == nil || err != nil {
		return nil, err
	}
	return parseObjects(out)
}

func parseObjects(out []byte) (map[string][]json.RawMessage, error) {
	var doc struct {
		Nftables []map[string]json.RawMessage `json:"nftables"`
	}
	if err := json.Unmarshal(out, &doc); err != nil {
		return nil, fmt.Errorf("parsing nft -j output: %w", err)
	}
	res := map[string][]json.RawMessage{}
	for _, o := range doc.Nftables {
		for typ, v := range o {
			res[typ] = append(res[typ], v)
		}
	}
	return res, nil
}

// ParseTableJSON reads `nft -j list table` output.
func ParseTableJSON(out []byte) (*Table, error) {
	objs, err := parseObjects(out)
	if err != nil {
		return nil, err
	}
	return tableOf(objs)
}

func tableOf(objs map[string][]json.RawMessage) (*Table, error) {
	t := &Table{}
	names, err := namesOf(objs, "chain")
	if err != nil {
		return nil, err
	}
	t.Chains = names
	for _, raw := range objs["rule"] {
		var jr struct {
			Chain   string  `json:"chain"`
			Handle  int     `json:"handle"`
			Comment *string `json:"comment"`
		}
		if err := json.Unmarshal(raw, &jr); err != nil {
			return nil, fmt.Errorf("parsing nft rule %s: %w", raw, err)
		}
		t.Rules = append(t.Rules, &knftables.Rule{Chain: jr.Chain, Handle: knftables.PtrTo(jr.Handle), Comment: jr.Comment})
	}
	return t, nil
}

type named struct {
	Name string            `json:"name"`
	Elem []json.RawMessage `json:"elem"`
}

// namesOf returns the names of the objects of type typ, in order.
func namesOf(objs map[string][]json.RawMessage, typ string) ([]string, error) {
	var out []string
	for _, raw := range objs[typ] {
		var o named
		if err := json.Unmarshal(raw, &o); err != nil {
			return nil, fmt.Errorf("parsing nft %s %s: %w", typ, raw, err)
		}
		out = append(out, o.Name)
	}
	return out, nil
}

// ListAll implements knftables.Interface.
func (r *Runner) ListAll(ctx context.Context) (map[string][]string, error) {
	objs, err := r.objects(ctx)
	if err != nil {
		return nil, err
	}
	res := map[string][]string{}
	for _, typ := range []string{"chain", "set", "map", "counter", "flowtable"} {
		names, err := namesOf(objs, typ)
		if err != nil {
			return nil, err
		}
		if names != nil {
			res[typ] = names
		}
	}
	return res, nil
}

// List implements knftables.Interface.
func (r *Runner) List(ctx context.Context, objectType string) ([]string, error) {
	all, err := r.ListAll(ctx)
	if err != nil {
		return nil, err
	}
	return all[strings.TrimSuffix(objectType, "s")], nil
}

// ListRules implements knftables.Interface: Chain, Handle and Comment are
// filled in, Rule is not (as with knftables' own implementation).
func (r *Runner) ListRules(ctx context.Context, chain string) ([]*knftables.Rule, error) {
	objs, err := r.objects(ctx)
	if err != nil {
		return nil, err
	}
	t, err := tableOf(objs)
	if err != nil {
		return nil, err
	}
	if chain == "" {
		return t.Rules, nil
	}
	if !t.HasChain(chain) {
		return nil, &Error{Msg: fmt.Sprintf("no chain %q in table %s %s", chain, r.family, r.table), Errno: syscall.ENOENT}
	}
	return t.RulesIn(chain), nil
}

// ListElements implements knftables.Interface for sets and maps with
// simple keys and values (addresses, names, verdicts).
func (r *Runner) ListElements(ctx context.Context, objectType, name string) ([]*knftables.Element, error) {
	objs, err := r.objects(ctx)
	if err != nil {
		return nil, err
	}
	for _, raw := range objs[objectType] {
		var o named
		if err := json.Unmarshal(raw, &o); err != nil {
			return nil, fmt.Errorf("parsing nft %s %s: %w", objectType, raw, err)
		}
		if o.Name != name {
			continue
		}
		var res []*knftables.Element
		for _, raw := range o.Elem {
			e, err := parseElement(raw, objectType == "map")
			if err != nil {
				return nil, fmt.Errorf("%s %s: %w", objectType, name, err)
			}
			if objectType == "map" {
				e.Map = name
			} else {
				e.Set = name
			}
			res = append(res, e)
		}
		return res, nil
	}
	return nil, &Error{Msg: fmt.Sprintf("no %s %q in table %s %s", objectType, name, r.family, r.table), Errno: syscall.ENOENT}
}

// ListCounters implements knftables.Interface: the table's named
// counters with their packets and bytes.
func (r *Runner) ListCounters(ctx context.Context) ([]*knftables.Counter, error) {
	objs, err := r.objects(ctx)
	if err != nil {
		return nil, err
	}
	var out []*knftables.Counter
	for _, raw := range objs["counter"] {
		var c struct {
			Name    string  `json:"name"`
			Comment *string `json:"comment"`
			Handle  int     `json:"handle"`
			Packets uint64  `json:"packets"`
			Bytes   uint64  `json:"bytes"`
		}
		if err := json.Unmarshal(raw, &c); err != nil {
			return nil, fmt.Errorf("parsing nft counter %s: %w", raw, err)
		}
		out = append(out, &knftables.Counter{Name: c.Name, Comment: c.Comment, Handle: knftables.PtrTo(c.Handle),
			Packets: knftables.PtrTo(c.Packets), Bytes: knftables.PtrTo(c.Bytes)})
	}
	return out, nil
}

func parseElement(raw json.RawMessage, isMap bool) (*knftables.Element, error) {
	e := &knftables.Element{}
	key := raw
	if isMap {
		var pair []json.RawMessage
		if err := json.Unmarshal(raw, &pair); err != nil || len(pair) != 2 {
			return nil, fmt.Errorf("unexpected map element %s", raw)
		}
		key = pair[0]
		v, err := keyFields(pair[1])
		if err != nil {
			return nil, err
		}
		// A concatenated value is one string, as knftables writes it.
		e.Value = []string{strings.Join(v, " . ")}
	}
	k, err := keyFields(key)
	if err != nil {
		return nil, err
	}
	e.Key = k
	var c struct {
		Elem *struct {
			Comment *string `json:"comment"`
		} `json:"elem"`
	}
	if json.Unmarshal(key, &c) == nil && c.Elem != nil {
		e.Comment = c.Elem.Comment
	}
	return e, nil
}

// keyFields renders a set element's key: one field, or one per part of a
// concatenation (`{"concat": [...]}`, possibly wrapped in `{"elem": ...}`).
func keyFields(raw json.RawMessage) ([]string, error) {
	var o map[string]json.RawMessage
	if json.Unmarshal(raw, &o) == nil {
		if inner, ok := o["elem"]; ok {
			var e map[string]json.RawMessage
			if err := json.Unmarshal(inner, &e); err == nil && e["val"] != nil {
				return keyFields(e["val"])
			}
		}
		if parts, ok := o["concat"]; ok {
			var list []json.RawMessage
			if err := json.Unmarshal(parts, &list); err != nil {
				return nil, fmt.Errorf("unexpected element %s", raw)
			}
			out := make([]string, len(list))
			for i, p := range list {
				f, err := exprString(p)
				if err != nil {
					return nil, err
				}
				out[i] = f
			}
			return out, nil
		}
	}
	k, err := exprString(raw)
	if err != nil {
		return nil, err
	}
	return []string{k}, nil
}

// exprString renders the simple JSON expressions found in our sets and
// maps the way nft's text syntax (and knftables) spells them.
func exprString(raw json.RawMessage) (string, error) {
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, nil
	}
	var num json.Number
	if json.Unmarshal(raw, &num) == nil {
		return num.String(), nil
	}
	var o map[string]json.RawMessage
	if err := json.Unmarshal(raw, &o); err != nil {
		return "", fmt.Errorf("unexpected element %s", raw)
	}
	for k, v := range o {
		switch k {
		case "elem":
			var inner map[string]json.RawMessage
			if err := json.Unmarshal(v, &inner); err != nil {
				return "", fmt.Errorf("unexpected element %s", raw)
			}
			return exprString(inner["val"])
		case "goto", "jump":
			var t struct {
				Target string `json:"target"`
			}
			_ = json.Unmarshal(v, &t)
			return k + " " + t.Target, nil
		case "accept", "drop", "continue", "return":
			return k, nil
		case "range": // intervals: "lo-hi"
			var r []json.RawMessage
			if err := json.Unmarshal(v, &r); err != nil || len(r) != 2 {
				return "", fmt.Errorf("unexpected element %s", raw)
			}
			lo, err1 := exprString(r[0])
			hi, err2 := exprString(r[1])
			if err1 != nil || err2 != nil {
				return "", fmt.Errorf("unexpected element %s", raw)
			}
			return lo + "-" + hi, nil
		case "prefix":
			var p struct {
				Addr string `json:"addr"`
				Len  int    `json:"len"`
			}
			_ = json.Unmarshal(v, &p)
			return p.Addr + "/" + strconv.Itoa(p.Len), nil
		}
	}
	return "", fmt.Errorf("unexpected element %s", raw)
}
