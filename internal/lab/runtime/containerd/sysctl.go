package containerd

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/flatnet/flatnet/internal/atomicfile"
	"github.com/flatnet/flatnet/internal/sysctl"
)

// KubeletSysctls are the host-global sysctls a kubelet sets at start
// (unless protectKernelDefaults, which makes it fail instead): the lab
// records them before its first kubelet starts and restores them when it
// goes down.
var KubeletSysctls = []string{"vm.overcommit_memory", "kernel.panic", "kernel.panic_on_oops"}

// SysctlRecord is where RecordSysctls keeps the values, in the lab's state
// dir.
func SysctlRecord(stateDir string) string { return filepath.Join(stateDir, "host-sysctls.json") }

// RecordSysctls writes the current values of KubeletSysctls to
// SysctlRecord, once: a record already there holds the values from before
// the lab's first kubelet and is kept.
func RecordSysctls(stateDir string) error {
	file := SysctlRecord(stateDir)
	if _, err := os.Stat(file); err == nil {
		return nil
	}
	vals := map[string]string{}
	for _, k := range KubeletSysctls {
		v, err := sysctl.Get(k)
		if err != nil {
			return fmt.Errorf("recording host sysctls before the kubelet changes them: %w", err)
		}
		vals[k] = v
	}
	b, err := json.MarshalIndent(vals, "", "  ")
	if err != nil {
		return err
	}
	if err := atomicfile.WriteFile(file, append(b, '\n'), 0o644); err != nil {
		return fmt.Errorf("recording host sysctls: %w", err)
	}
	return nil
}

// RestoreSysctls sets the values RecordSysctls recorded and removes the
// record; with no record it does nothing. Call it when the lab's last
// kubelet has stopped.
func RestoreSysctls(stateDir string) error {
	file := SysctlRecord(stateDir)
	b, err := os.ReadFile(file)
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("restoring host sysctls: %w", err)
	}
	vals := map[string]string{}
	if err := json.Unmarshal(b, &vals); err != nil {
		return fmt.Errorf("restoring host sysctls: %s: %w", file, err)
	}
	var errs []error
	for _, k := range KubeletSysctls {
		if v, ok := vals[k]; ok {
			errs = append(errs, sysctl.Set(k, v))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("restoring host sysctls (record kept in %s): %w", file, err)
	}
	return os.Remove(file)
}
