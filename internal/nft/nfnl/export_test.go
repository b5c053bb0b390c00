package nfnl

import "sigs.k8s.io/knftables"

// CompileTx compiles txs in order with no kernel (elements may go to sets
// an earlier one created) and returns the number of messages.
func CompileTx(txs ...*knftables.Transaction) (int, error) {
	sets := map[string]*setInfo{}
	n := 0
	for _, tx := range txs {
		text := tx.String()
		first, err := parseLine(text[:indexNL(text)])
		if err != nil {
			return 0, err
		}
		c, err := compileText(first.family, first.table, text, func(name string) (*setInfo, error) {
			if s, ok := sets[name]; ok {
				return s, nil
			}
			return nil, unsupported("set %q unknown", name)
		})
		if err != nil {
			return 0, err
		}
		for name, s := range c.created {
			sets[name] = s
		}
		for name := range c.deleted {
			delete(sets, name)
		}
		n += len(c.msgs)
	}
	return n, nil
}

func indexNL(s string) int {
	for i := range len(s) {
		if s[i] == '\n' {
			return i
		}
	}
	return len(s)
}
