package hostlocal

// PLACEHOLDER: replaced by the host-local implementation.

import (
	"errors"

	"github.com/containernetworking/cni/pkg/skel"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/flatnet/flatnet/internal/cni/plugin"
)

// Name is the plugin name.
const Name = "host-local"

var errTODO = errors.New("host-local: not built yet")

func Add(args *skel.CmdArgs) (*current.Result, error) { return nil, errTODO }
func Del(args *skel.CmdArgs) error                    { return errTODO }
func Check(args *skel.CmdArgs) error                  { return errTODO }
func GC(args *skel.CmdArgs) error                     { return errTODO }
func Status(args *skel.CmdArgs) error                 { return errTODO }

// Plugin is host-local as a CNI plugin.
var Plugin = plugin.Plugin{Name: Name}
