// Package mountinfo reads this process's mount table (/proc/self/mountinfo)
// and unmounts what is under a directory: the lab's state dir at `lab down`,
// a real node's dir at its runtime's Down.
package mountinfo

import (
	"errors"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"

	"golang.org/x/sys/unix"
)

// Under returns the mount points at or under dir in this mount namespace,
// deepest first (the order to unmount them in).
func Under(dir string) ([]string, error) {
	b, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return nil, err
	}
	return under(string(b), dir), nil
}

func under(table, dir string) []string {
	var points []string
	for _, l := range strings.Split(table, "\n") {
		fields := strings.Fields(l)
		if len(fields) < 5 {
			continue
		}
		mp := Unescape(fields[4])
		if mp == dir || strings.HasPrefix(mp, dir+"/") {
			points = append(points, mp)
		}
	}
	// Longer paths first; among equal ones (a mount stacked on a mount
	// point) the later, upper one first.
	for i, j := 0, len(points)-1; i < j; i, j = i+1, j-1 {
		points[i], points[j] = points[j], points[i]
	}
	sort.SliceStable(points, func(i, j int) bool { return len(points[i]) > len(points[j]) })
	return points
}

// UnmountUnder detaches every mount point at or under dir, deepest first,
// and returns how many it found.
func UnmountUnder(dir string) (int, error) {
	points, err := Under(dir)
	if err != nil {
		return 0, err
	}
	var errs []error
	for _, p := range points {
		if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
			errs = append(errs, fmt.Errorf("unmounting %s: %w", p, err))
		}
	}
	return len(points), errors.Join(errs...)
}

// Unescape decodes mountinfo's octal escapes (\040 for a space).
func Unescape(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+3 < len(s) {
			if v, err := strconv.ParseUint(s[i+1:i+4], 8, 8); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
