// Package sysctl reads and writes /proc/sys. Paths under net/ refer to the
// network namespace of the calling thread, so call these inside netns.Do
// to change a container's settings.
package sysctl

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
)

func path(name string) string {
	return filepath.Join("/proc/sys", strings.ReplaceAll(name, ".", "/"))
}

// Get returns the value of a sysctl such as "net.ipv4.ip_forward".
func Get(name string) (string, error) {
	b, err := os.ReadFile(path(name))
	if err != nil {
		return "", fmt.Errorf("reading sysctl %s: %w", name, err)
	}
	return strings.TrimSpace(string(b)), nil
}

// Set writes value to a sysctl, skipping the write when it already holds
// that value (writes to some net sysctls have side effects and cost time).
func Set(name, value string) error {
	if cur, err := Get(name); err == nil && cur == value {
		return nil
	}
	if err := os.WriteFile(path(name), []byte(value), 0o644); err != nil {
		return fmt.Errorf("writing sysctl %s=%s: %w", name, value, err)
	}
	return nil
}

// SetPath is Set for a name with a component that may contain dots, such
// as an interface name: SetPath("net/ipv4/conf", ifname, "forwarding").
func SetPath(value string, parts ...string) error {
	p := filepath.Join(append([]string{"/proc/sys"}, parts...)...)
	if b, err := os.ReadFile(p); err == nil && strings.TrimSpace(string(b)) == value {
		return nil
	}
	if err := os.WriteFile(p, []byte(value), 0o644); err != nil {
		return fmt.Errorf("writing sysctl %s=%s: %w", p, value, err)
	}
	return nil
}
