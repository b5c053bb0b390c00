package main

import (
	"bufio"
	"fmt"
	"io"
	"regexp"
	"strings"
)

// skipEntry is one line of the skip list: a regexp matched against a spec's
// full name, as --ginkgo.skip does, and the comment lines above it.
type skipEntry struct {
	Pattern string
	Reason  string
	File    string // the list's path, for pointing at the entry
	Line    int
	re      *regexp.Regexp
}

// parseSkipList reads the skip list: one Go regexp per line, each under the
// comment lines ("# ...") that give its reason. A blank line ends a comment
// block, so the file's header (a block followed by a blank line) belongs to
// no entry. An entry without a reason, or one that does not compile, is an
// error: the list exists so that every skipped spec says why.
func parseSkipList(r io.Reader, name string) ([]skipEntry, error) {
	var entries []skipEntry
	var reason []string
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		switch {
		case line == "":
			reason = nil
		case strings.HasPrefix(line, "#"):
			reason = append(reason, strings.TrimSpace(strings.TrimPrefix(line, "#")))
		default:
			if len(reason) == 0 {
				return nil, fmt.Errorf("%s:%d: %q has no reason: write a \"# why\" comment line right above it", name, n, line)
			}
			re, err := regexp.Compile(line)
			if err != nil {
				return nil, fmt.Errorf("%s:%d: %q is not a Go regexp (ginkgo's --skip syntax): %w", name, n, line, err)
			}
			entries = append(entries, skipEntry{Pattern: line, Reason: strings.Join(reason, " "), File: name, Line: n, re: re})
			// The next entry needs its own comment.
			reason = nil
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading %s: %w", name, err)
	}
	return entries, nil
}

// skipRegexp is the one regexp ginkgo's --skip takes: the entries as
// alternatives, each grouped so that its own | stays inside it.
func skipRegexp(entries []skipEntry) string {
	parts := make([]string, len(entries))
	for i, e := range entries {
		parts[i] = "(" + e.Pattern + ")"
	}
	return strings.Join(parts, "|")
}

// match returns the first entry that matches text, or nil.
func match(entries []skipEntry, text string) *skipEntry {
	for i := range entries {
		if entries[i].re.MatchString(text) {
			return &entries[i]
		}
	}
	return nil
}
