package proc

import (
	"bytes"
	"os"
	"path/filepath"
	"strconv"
	"strings"
)

// OwnerEnv marks the processes the lab starts: every daemon Start runs
// (and, inherited, whatever the daemon runs) and every container the lab
// runtime starts carry OwnerEnv=<state dir of their starter>. The mark
// survives what other identities do not: a process whose pid file is lost,
// a container whose network namespace was deleted under it (then no
// namespace inode leads to it any more), a child that left its parent's
// process group. `lab down` stops by it whatever is left.
const OwnerEnv = "FLATNET_OWNER"

// OwnerEntry is the environment entry that marks a process started for
// the state dir dir (made absolute).
func OwnerEntry(dir string) string {
	if abs, err := filepath.Abs(dir); err == nil {
		dir = abs
	}
	return OwnerEnv + "=" + dir
}

// OwnedBy reports whether process pid carries the mark of dir or of a dir
// under it (its environment as it was at exec, /proc/PID/environ).
func OwnedBy(pid int, dir string) bool {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/environ")
	if err != nil {
		return false
	}
	dir = strings.TrimPrefix(OwnerEntry(dir), OwnerEnv+"=")
	for _, kv := range bytes.Split(b, []byte{0}) {
		v, ok := bytes.CutPrefix(kv, []byte(OwnerEnv+"="))
		if ok && (string(v) == dir || strings.HasPrefix(string(v), dir+"/")) {
			return true
		}
	}
	return false
}
