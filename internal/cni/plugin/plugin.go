// Package plugin wires a flatnet CNI plugin into the CNI skeleton: the
// supported spec versions, error-code translation at the process edge, and
// helpers every plugin needs (GC attachment lists, result printing).
package plugin

import (
	"encoding/json"
	"fmt"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"
	"github.com/containernetworking/cni/pkg/version"

	"github.com/flatnet/flatnet/internal/cni/cnierr"
	"github.com/flatnet/flatnet/internal/netlinkx"
)

// Version is the flatnet version, set at build time with -ldflags.
var Version = "dev"

// SupportedVersions lists every CNI spec version our plugins speak. The
// pre-1.0 versions are there so that old conflists (0.3.x, 0.4.0) work.
var SupportedVersions = version.PluginSupports("0.1.0", "0.2.0", "0.3.0", "0.3.1", "0.4.0", "1.0.0", "1.1.0")

// Plugin is one CNI plugin served by the multi-call binary.
type Plugin struct {
	Name  string
	Funcs skel.CNIFuncs
}

// Main runs p as the current process's CNI plugin and exits.
func Main(p Plugin) {
	skel.PluginMainFuncs(withCodes(p.Funcs), SupportedVersions,
		fmt.Sprintf("flatnet %s plugin %s (CNI %v)", p.Name, Version, SupportedVersions.SupportedVersions()))
}

// withCodes converts errors from every verb into *types.Error carrying the
// code found in the chain, so skel never falls back to a bare 999 for an
// error we did classify.
func withCodes(f skel.CNIFuncs) skel.CNIFuncs {
	wrap := func(fn func(*skel.CmdArgs) error) func(*skel.CmdArgs) error {
		if fn == nil {
			return nil
		}
		return func(a *skel.CmdArgs) error {
			if err := fn(a); err != nil {
				return cnierr.ToTypes(err)
			}
			return nil
		}
	}
	return skel.CNIFuncs{Add: wrap(f.Add), Del: wrap(f.Del), Check: wrap(f.Check), GC: wrap(f.GC), Status: wrap(f.Status)}
}

// Attachment names one container attachment in a GC request.
type Attachment struct {
	ContainerID string `json:"containerID"`
	IfName      string `json:"ifname"`
}

// GC request keys for the attachments still in use: the spec's name, and
// the spelling from a spec bug (CNI #1101) that libcni sends as well.
const (
	ValidAttachmentsKey = "cni.dev/valid-attachments"
	AttachmentsKey      = "cni.dev/attachments"
)

// ValidAttachments reads the attachments a GC request says are still in
// use; we accept either key and take the union. A request with neither key
// is refused (code 7): GC frees everything not listed, so a config that
// lost the list (a runtime bug, a hand-written request, libcni called
// without GCArgs) would otherwise free every address and rule of the
// network under running pods. An empty list (or null, which libcni sends
// when the runtime has no attachments) is a real order to collect all.
func ValidAttachments(stdin []byte) (map[Attachment]bool, error) {
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(stdin, &keys); err != nil {
		return nil, cnierr.Wrap(cnierr.DecodingFailure, err, "decoding GC request")
	}
	out := map[Attachment]bool{}
	found := false
	for _, key := range []string{ValidAttachmentsKey, AttachmentsKey} {
		raw, ok := keys[key]
		if !ok {
			continue
		}
		found = true
		var list []Attachment
		if err := json.Unmarshal(raw, &list); err != nil {
			return nil, cnierr.Wrap(cnierr.DecodingFailure, err, "decoding GC request: %q", key)
		}
		for _, a := range list {
			out[a] = true
		}
	}
	if !found {
		return nil, cnierr.New(cnierr.InvalidConfig,
			"GC request without %q (or %q): refusing to treat it as \"no attachment is in use\" and free everything; "+
				"the runtime must list the attachments still in use (an empty list collects all)",
			ValidAttachmentsKey, AttachmentsKey)
	}
	return out, nil
}

// ParsePrevResult decodes conf.RawPrevResult into conf.PrevResult; a
// missing prevResult is fine (nil).
func ParsePrevResult(conf *types.NetConf) error {
	if err := version.ParsePrevResult(conf); err != nil {
		return cnierr.Wrap(cnierr.DecodingFailure, err, "decoding prevResult")
	}
	return nil
}

// PrevResult returns conf.PrevResult converted to the current result type,
// or nil when there is none.
func PrevResult(conf *types.NetConf) (*current.Result, error) {
	if conf.PrevResult == nil {
		return nil, nil
	}
	r, err := current.NewResultFromResult(conf.PrevResult)
	if err != nil {
		return nil, cnierr.Wrap(cnierr.DecodingFailure, err, "converting prevResult to %s", current.ImplementedSpecVersion)
	}
	return r, nil
}

// PrintResult prints r in the version the config asked for.
func PrintResult(r types.Result, cniVersion string) error {
	if err := types.PrintResult(r, cniVersion); err != nil {
		return cnierr.Wrap(cnierr.IncompatibleVersion, err, "printing result as CNI %s", cniVersion)
	}
	return nil
}

// Stage is a plugin's verbs as the flatnet plugin type calls them in
// process (internal/cni/allinone): Add returns its result, in the config's
// CNI version, instead of printing it.
type Stage struct {
	Name   string
	Add    func(*skel.CmdArgs) (types.Result, error)
	Del    func(*skel.CmdArgs) error
	Check  func(*skel.CmdArgs) error
	GC     func(*skel.CmdArgs) error
	Status func(*skel.CmdArgs) error
	// Unhook and Release, when set, are Del in two parts: Unhook removes
	// what the stage put in the kernel, Release frees the pod's address.
	// The flatnet type runs every stage's Unhook at once and the Releases
	// after them all, so that no rule of any stage still points at an
	// address another pod may hold; the plugin's own DEL is Unhook, then
	// Release. Unhook hands the host links it removes to links (nil:
	// remove them itself): the flatnet type gives every stage the same
	// batch and removes them all in one request.
	Unhook  func(args *skel.CmdArgs, links netlinkx.LinkDeleter) error
	Release func(*skel.CmdArgs) error
	// PassThrough says that Add returns its prevResult as it is (portmap
	// does): the flatnet type runs such a stage's ADD beside the stage
	// before it, both on that one's prevResult.
	PassThrough bool
}
