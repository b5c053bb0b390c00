package main

import (
	"encoding/xml"
	"fmt"
	"io"
	"regexp"
	"strings"
)

// The subset of ginkgo v2's JUnit report (reporters/junit_report.go) that
// the summary reads. The e2e framework writes it to <report-dir>/junit_01.xml
// with every spec of the suite in it, the ones outside the focus as
// "skipped" with no message, and the spec's full text after its node type
// ("[It] [sig-network] Services should ...").
type junitSuites struct {
	XMLName  xml.Name     `xml:"testsuites"`
	Tests    int          `xml:"tests,attr"`
	Disabled int          `xml:"disabled,attr"`
	Errors   int          `xml:"errors,attr"`
	Failures int          `xml:"failures,attr"`
	Time     float64      `xml:"time,attr"`
	Suites   []junitSuite `xml:"testsuite"`
}

type junitSuite struct {
	Name       string          `xml:"name,attr"`
	Package    string          `xml:"package,attr"`
	Tests      int             `xml:"tests,attr"`
	Disabled   int             `xml:"disabled,attr"`
	Skipped    int             `xml:"skipped,attr"`
	Errors     int             `xml:"errors,attr"`
	Failures   int             `xml:"failures,attr"`
	Time       float64         `xml:"time,attr"`
	Timestamp  string          `xml:"timestamp,attr"`
	Properties []junitProperty `xml:"properties>property"`
	Cases      []junitCase     `xml:"testcase"`
}

type junitProperty struct {
	Name  string `xml:"name,attr"`
	Value string `xml:"value,attr"`
}

type junitCase struct {
	Name      string        `xml:"name,attr"`
	Classname string        `xml:"classname,attr"`
	Status    string        `xml:"status,attr"`
	Time      float64       `xml:"time,attr"`
	Skipped   *junitMessage `xml:"skipped"`
	Failure   *junitMessage `xml:"failure"`
	Error     *junitMessage `xml:"error"`
	SystemOut string        `xml:"system-out,omitempty"`
	SystemErr string        `xml:"system-err,omitempty"`
}

type junitMessage struct {
	Message string `xml:"message,attr"`
	Type    string `xml:"type,attr,omitempty"`
	Text    string `xml:",chardata"`
}

func parseJUnit(r io.Reader) (*junitSuite, error) {
	var s junitSuites
	if err := xml.NewDecoder(r).Decode(&s); err != nil {
		return nil, fmt.Errorf("not a JUnit report: %w", err)
	}
	// ginkgo merges the parallel processes into one suite.
	if len(s.Suites) != 1 {
		return nil, fmt.Errorf("want one <testsuite> (ginkgo writes one), found %d", len(s.Suites))
	}
	return &s.Suites[0], nil
}

// writeJUnit writes suite with only the given cases, its counts
// recomputed as ginkgo computes them. The suite's report lists all ~3,200
// specs of e2e.test (1.1 MB); the copy kept in the repo lists the phase's.
func writeJUnit(w io.Writer, suite *junitSuite, cases []junitCase) error {
	s := *suite
	s.Cases = cases
	s.Tests, s.Disabled, s.Skipped, s.Errors, s.Failures = len(cases), 0, 0, 0, 0
	for _, c := range cases {
		switch {
		case c.Status == "pending":
			s.Disabled++
		case c.Skipped != nil:
			s.Skipped++
		case c.Error != nil || c.Status == "aborted":
			s.Errors++
		case c.Failure != nil:
			s.Failures++
		}
	}
	all := junitSuites{Tests: s.Tests, Disabled: s.Disabled + s.Skipped, Errors: s.Errors, Failures: s.Failures, Time: s.Time, Suites: []junitSuite{s}}
	if _, err := io.WriteString(w, xml.Header); err != nil {
		return err
	}
	enc := xml.NewEncoder(w)
	enc.Indent("", "  ")
	if err := enc.Encode(all); err != nil {
		return err
	}
	_, err := io.WriteString(w, "\n")
	return err
}

func (s *junitSuite) property(name string) string {
	for _, p := range s.Properties {
		if p.Name == name {
			return p.Value
		}
	}
	return ""
}

// nodeType matches the node type ginkgo puts before the spec's text.
var nodeType = regexp.MustCompile(`^\[([A-Za-z]+)\] ?`)

// split returns the case's node type ("It", "SynchronizedBeforeSuite", ...)
// and the spec's full text (empty for suite nodes).
func (c junitCase) split() (node, text string) {
	m := nodeType.FindStringSubmatch(c.Name)
	if m == nil {
		return "", c.Name
	}
	return m[1], c.Name[len(m[0]):]
}

// failed reports whether the case counts as a failure: ginkgo's failed,
// timedout, panicked, interrupted and aborted states.
func (c junitCase) failed() bool {
	switch c.Status {
	case "passed", "skipped", "pending":
		return false
	}
	return true
}

// failureText is the failure's description, or the error's (panics and
// interrupts are written as <error>).
func (c junitCase) failureText() string {
	for _, m := range []*junitMessage{c.Failure, c.Error} {
		if m == nil {
			continue
		}
		if t := strings.TrimSpace(m.Text); t != "" {
			return t
		}
		if m.Message != "" {
			return m.Message
		}
	}
	return c.Status
}

// skipMessage is the reason the suite itself gave for skipping a spec at
// run time (e2eskipper: a provider, a node count, a feature gate); empty
// when ginkgo only left it out.
func (c junitCase) skipMessage() string {
	if c.Skipped == nil {
		return ""
	}
	m := strings.TrimPrefix(c.Skipped.Message, "skipped")
	return strings.TrimSpace(strings.TrimPrefix(m, " - "))
}
