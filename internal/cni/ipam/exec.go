package ipam

// Running a delegated IPAM plugin, as libcni's invoke package does it.
//
// Why not invoke itself: it imports OpenTelemetry's propagation, and with
// it net/http, crypto/tls and x509, whose package initialisation and
// first page faults cost every flatnet-cni process CPU at its start
// (docs/benchmarks.md has the figures), even the many that never delegate
// (host-local runs in process). What is kept of invoke's contract: the
// plugin is looked up in CNI_PATH as a regular file; it gets this
// process's environment with the CNI_* variables of the request replacing
// any inherited ones; a "text file busy" start is retried (the plugin
// being installed); a failure's stdout is read as the plugin's CNI error
// (code and message), else its stderr is quoted; a result without a
// cniVersion is taken to be in the config's version.

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	"github.com/containernetworking/cni/pkg/types/create"
)

// findInPath returns the path of plugin in the first of paths holding a
// regular file of that name.
func findInPath(plugin string, paths []string) (string, error) {
	if plugin == "" || strings.ContainsRune(plugin, os.PathSeparator) {
		return "", fmt.Errorf("invalid plugin name %q", plugin)
	}
	for _, dir := range paths {
		p := filepath.Join(dir, plugin)
		if fi, err := os.Stat(p); err == nil && fi.Mode().IsRegular() {
			return p, nil
		}
	}
	return "", fmt.Errorf("failed to find plugin %q in path %s", plugin, paths)
}

// delegateEnv is environ with the request's CNI_* variables added last:
// os/exec keeps only the last value of a name, so they replace inherited
// ones.
func delegateEnv(environ []string, verb string, args *skel.CmdArgs) []string {
	return append(slices.Clip(environ),
		"CNI_COMMAND="+verb,
		"CNI_CONTAINERID="+args.ContainerID,
		"CNI_NETNS="+args.Netns,
		"CNI_ARGS="+args.Args,
		"CNI_IFNAME="+args.IfName,
		"CNI_PATH="+args.Path,
	)
}

// busyRetries and busyWait: how often and how long a plugin start that
// fails with ETXTBSY is retried.
const (
	busyRetries = 5
	busyWait    = time.Second
)

// execPlugin runs the plugin at path for verb and returns its stdout.
func execPlugin(ctx context.Context, path, verb string, args *skel.CmdArgs) ([]byte, error) {
	env := delegateEnv(os.Environ(), verb, args)
	for attempt := 0; ; attempt++ {
		var stdout, stderr bytes.Buffer
		c := exec.CommandContext(ctx, path)
		c.Env = env
		c.Stdin = bytes.NewReader(args.StdinData)
		c.Stdout, c.Stderr = &stdout, &stderr
		err := c.Run()
		if err == nil {
			return stdout.Bytes(), nil
		}
		if errors.Is(err, syscall.ETXTBSY) && attempt < busyRetries {
			select {
			case <-time.After(busyWait):
				continue
			case <-ctx.Done():
				return nil, ctx.Err()
			}
		}
		return nil, pluginError(err, stdout.Bytes(), stderr.Bytes())
	}
}

// pluginError is a failed plugin's CNI error: its stdout when that is
// one, else a message quoting its stderr.
func pluginError(err error, stdout, stderr []byte) error {
	e := &types.Error{}
	switch {
	case len(stdout) > 0:
		if perr := json.Unmarshal(stdout, e); perr != nil {
			e.Msg = fmt.Sprintf("netplugin failed but error parsing its diagnostic message %q: %v", stdout, perr)
		}
	case len(stderr) > 0:
		e.Msg = fmt.Sprintf("netplugin failed: %q: %v", stderr, err)
	default:
		e.Msg = fmt.Sprintf("netplugin failed with no error message: %v", err)
	}
	return e
}

// parseResult decodes a delegate's ADD result; one without a cniVersion
// is in the config's (whose own default is 0.1.0).
func parseResult(netconf, out []byte) (types.Result, error) {
	var raw map[string]any
	if err := json.Unmarshal(out, &raw); err != nil {
		return nil, fmt.Errorf("failed to unmarshal raw result: %w", err)
	}
	if v, _ := raw["cniVersion"].(string); v != "" {
		return create.Create(v, out)
	}
	v, err := create.DecodeVersion(netconf)
	if err != nil {
		return nil, err
	}
	if raw == nil { // the plugin printed null
		raw = map[string]any{}
	}
	raw["cniVersion"] = v
	fixed, err := json.Marshal(raw)
	if err != nil {
		return nil, fmt.Errorf("failed to remarshal fixed result: %w", err)
	}
	return create.Create(v, fixed)
}
