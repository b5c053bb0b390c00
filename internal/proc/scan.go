package proc

import (
	"os"
	"strconv"
)

// Scan returns the PIDs in /proc, other than this process, for which keep
// returns true. Identity checks (start time, cmdline) are the caller's.
func Scan(keep func(pid int) bool) []int {
	ents, err := os.ReadDir("/proc")
	if err != nil {
		return nil
	}
	self := os.Getpid()
	var out []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil || pid == self {
			continue
		}
		if keep(pid) {
			out = append(out, pid)
		}
	}
	return out
}
