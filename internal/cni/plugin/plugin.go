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

// ValidAttachments reads the attachments a GC request says are still in
// use. libcni sends both "cni.dev/valid-attachments" (the spec's name) and
// "cni.dev/attachments" (a spelling from a spec bug, CNI #1101); we accept
// either and take the union.
func ValidAttachments(stdin []byte) (map[Attachment]bool, error) {
	var conf struct {
		Valid []Attachment `json:"cni.dev/valid-attachments"`
		Alias []Attachment `json:"cni.dev/attachments"`
	}
	if err := json.Unmarshal(stdin, &conf); err != nil {
		return nil, cnierr.Wrap(cnierr.DecodingFailure, err, "decoding GC attachment list")
	}
	out := make(map[Attachment]bool, len(conf.Valid)+len(conf.Alias))
	for _, a := range append(conf.Valid, conf.Alias...) {
		out[a] = true
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
