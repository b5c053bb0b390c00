// Package ipam calls a main plugin's IPAM plugin (the "ipam" block of its
// config) for every verb.
//
// When the IPAM is host-local and the host-local in CNI_PATH is this very
// binary (or there is none), it runs in this process: no fork/exec, no
// second Go runtime start. The in-process host-local uses the same on-disk
// store and the same lock file as an exec'd one, so both can share a
// dataDir. Any other IPAM type, or a host-local that is a different binary
// (say, the reference plugin), is exec'd as the spec describes.
package ipam

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	"github.com/containernetworking/cni/pkg/skel"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/flatnet/flatnet/internal/cni/cnierr"
	"github.com/flatnet/flatnet/internal/cni/hostlocal"
)

// Type returns the ipam.type of a plugin config, or an error with code 7
// when there is no ipam block.
func Type(stdin []byte) (string, error) {
	var c struct {
		IPAM *struct {
			Type string `json:"type"`
		} `json:"ipam"`
	}
	if err := json.Unmarshal(stdin, &c); err != nil {
		return "", cnierr.Wrap(cnierr.DecodingFailure, err, "decoding ipam block")
	}
	if c.IPAM == nil || c.IPAM.Type == "" {
		return "", cnierr.New(cnierr.InvalidConfig, `config has no "ipam" block with a "type"`)
	}
	return c.IPAM.Type, nil
}

// inProcess reports whether ipamType can run inside this process, and
// otherwise returns the path of the plugin to exec. An IPAM type not found
// in CNI_PATH is an invalid configuration (code 7).
func inProcess(ipamType, cniPath string) (bool, string, error) {
	paths := filepath.SplitList(cniPath)
	path, err := findInPath(ipamType, paths)
	if ipamType == hostlocal.Name {
		if err != nil {
			return true, "", nil
		}
		if same(path) {
			return true, "", nil
		}
		return false, path, nil
	}
	if err != nil {
		return false, "", cnierr.Wrap(cnierr.InvalidConfig, err, "unknown ipam type %q: no plugin of that name in CNI_PATH %q", ipamType, cniPath)
	}
	return false, path, nil
}

// same reports whether path is the running executable.
func same(path string) bool {
	self, err := os.Stat("/proc/self/exe")
	if err != nil {
		return false
	}
	other, err := os.Stat(path)
	if err != nil {
		return false
	}
	return os.SameFile(self, other)
}

// Add allocates addresses for args. The result is in the current (1.x)
// result type; interfaces are not set.
func Add(ctx context.Context, args *skel.CmdArgs) (*current.Result, error) {
	t, err := Type(args.StdinData)
	if err != nil {
		return nil, err
	}
	local, path, err := inProcess(t, args.Path)
	if err != nil {
		return nil, err
	}
	if local {
		return hostlocal.Add(args)
	}
	out, err := execPlugin(ctx, path, "ADD", args)
	if err != nil {
		return nil, passCode(err, "ipam plugin %s ADD", t)
	}
	r, err := parseResult(args.StdinData, out)
	if err != nil {
		return nil, cnierr.Wrap(cnierr.DecodingFailure, err, "decoding %s result", t)
	}
	res, err := current.NewResultFromResult(r)
	if err != nil {
		return nil, cnierr.Wrap(cnierr.DecodingFailure, err, "converting %s result", t)
	}
	return res, nil
}

// Del releases args' addresses.
func Del(ctx context.Context, args *skel.CmdArgs) error {
	return noResult(ctx, "DEL", args, hostlocal.Del)
}

// Check verifies args' reservation.
func Check(ctx context.Context, args *skel.CmdArgs) error {
	return noResult(ctx, "CHECK", args, hostlocal.Check)
}

// GC passes a GC request (with its valid-attachments list) to the IPAM.
func GC(ctx context.Context, args *skel.CmdArgs) error {
	return noResult(ctx, "GC", args, hostlocal.GC)
}

// Status asks the IPAM whether it can still hand out addresses.
func Status(ctx context.Context, args *skel.CmdArgs) error {
	return noResult(ctx, "STATUS", args, hostlocal.Status)
}

func noResult(ctx context.Context, verb string, args *skel.CmdArgs, local func(*skel.CmdArgs) error) error {
	t, err := Type(args.StdinData)
	if err != nil {
		return err
	}
	isLocal, path, err := inProcess(t, args.Path)
	if err != nil {
		return err
	}
	if isLocal {
		return local(args)
	}
	if _, err := execPlugin(ctx, path, verb, args); err != nil {
		return passCode(err, "ipam plugin %s %s", t, verb)
	}
	return nil
}

// passCode keeps the code of an exec'd plugin's error and says which
// plugin and verb produced it.
func passCode(err error, format string, a ...any) error {
	msg := fmt.Sprintf(format, a...)
	if code, ok := cnierr.Code(err); ok {
		return cnierr.Wrap(code, err, "%s", msg)
	}
	return fmt.Errorf("%s: %w", msg, err)
}
