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
	Suites []junitSuite `xml:"testsuite"`
}

type junitSuite struct {
	Name       string          `xml:"name,attr"`
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
}

type junitMessage struct {
	Message string `xml:"message,attr"`
	Type    string `xml:"type,attr"`
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
