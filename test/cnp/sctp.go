package cnp

// SCTP: the suite's fixture serves SCTP on every pod (agnhost porter, ports
// 9003 and 9005) and some tests probe it, the SCTP ones and a few others
// beside TCP and UDP. Where the kernel has no SCTP such a probe fails
// ("OTHER: protocol not supported") whatever the policy says, so the
// runner skips those tests through the suite's SkipTests option, each with
// its reason. Which tests probe SCTP is read from the suite's own sources
// (embedded in the module as conformance.Manifests), not kept by hand.

import (
	"errors"
	"fmt"
	"io/fs"
	"regexp"
	"strings"
	"syscall"

	"sigs.k8s.io/network-policy-api/conformance"
)

// kernelSCTP reports whether this kernel (the lab's nodes share it) opens
// SCTP sockets, and the error when it does not.
func kernelSCTP() (bool, error) {
	fd, err := syscall.Socket(syscall.AF_INET, syscall.SOCK_STREAM, syscall.IPPROTO_SCTP)
	if err == nil {
		syscall.Close(fd)
		return true, nil
	}
	if errors.Is(err, syscall.EPROTONOSUPPORT) || errors.Is(err, syscall.ESOCKTNOSUPPORT) {
		return false, err
	}
	return false, fmt.Errorf("probing for SCTP: %w", err)
}

var shortName = regexp.MustCompile(`ShortName:\s*"([^"]+)"`)

// sctpTests maps each test of the suite that probes SCTP to why it needs
// it, from the test sources: a test is the text from one
// `suite.ConformanceTest{` to the next, and it probes SCTP when it says
// "sctp" (the protocol argument of its PokeServer calls).
func sctpTests(fsys fs.FS) (map[string]string, error) {
	files, err := fs.Glob(fsys, "tests/*.go")
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, errors.New("no tests/*.go in the suite's embedded files")
	}
	out := map[string]string{}
	for _, f := range files {
		b, err := fs.ReadFile(fsys, f)
		if err != nil {
			return nil, err
		}
		parts := strings.Split(string(b), "suite.ConformanceTest{")
		for _, p := range parts[1:] {
			m := shortName.FindStringSubmatch(p)
			if m == nil {
				return nil, fmt.Errorf("%s: a suite.ConformanceTest without a ShortName", f)
			}
			if !strings.Contains(p, `"sctp"`) {
				continue
			}
			if strings.Contains(m[1], "SCTP") {
				out[m[1]] = "an SCTP test"
			} else {
				out[m[1]] = "probes SCTP (agnhost connect --protocol=sctp) besides TCP and UDP"
			}
		}
	}
	return out, nil
}

// sctpSkips is what -sctp=auto adds to -skip-tests on a kernel without SCTP.
func sctpSkips() (map[string]string, error) {
	ok, why := kernelSCTP()
	if ok {
		return nil, nil
	}
	if !errors.Is(why, syscall.EPROTONOSUPPORT) && !errors.Is(why, syscall.ESOCKTNOSUPPORT) {
		return nil, why
	}
	tests, err := sctpTests(conformance.Manifests)
	if err != nil {
		return nil, err
	}
	out := map[string]string{}
	for name, what := range tests {
		out[name] = fmt.Sprintf("%s; this kernel has no SCTP (socket(AF_INET, SOCK_STREAM, IPPROTO_SCTP): %v), so every SCTP probe fails whatever the policy", what, why)
	}
	return out, nil
}
