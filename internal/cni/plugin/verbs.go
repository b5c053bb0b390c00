package plugin

// Steps that many verbs share: reading prevResult, checking CNI_NETNS,
// undoing a failed ADD.

import (
	"errors"
	"fmt"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/flatnet/flatnet/internal/cni/cnierr"
	"github.com/flatnet/flatnet/internal/netns"
)

// LoadPrevResult decodes conf's prevResult (ParsePrevResult) and returns
// it as the current result type (PrevResult): nil when there is none.
func LoadPrevResult(conf *types.NetConf) (*current.Result, error) {
	if err := ParsePrevResult(conf); err != nil {
		return nil, err
	}
	return PrevResult(conf)
}

// CheckNetNS checks CNI_NETNS: code 4 when it is unset, 3 when the
// namespace does not exist, 8 when it is not a usable namespace.
func CheckNetNS(path string) error {
	if path == "" {
		return cnierr.New(cnierr.InvalidEnvironment, "CNI_NETNS is not set")
	}
	if err := netns.Check(path); err != nil {
		if errors.Is(err, netns.ErrNotExist) {
			return cnierr.Wrap(cnierr.UnknownContainer, err, "container netns")
		}
		return cnierr.Wrap(cnierr.InvalidNetNS, err, "container netns")
	}
	return nil
}

// Undo collects the reversal of each completed ADD step.
type Undo []func() error

// Push registers the reversal of the step just done.
func (u *Undo) Push(f func() error) { *u = append(*u, f) }

// Run reverses the steps, newest first, and reports what it could not undo.
func (u Undo) Run() error {
	var errs []error
	for i := len(u) - 1; i >= 0; i-- {
		if err := u[i](); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// OnError, deferred with the ADD's named error result, runs the steps when
// the ADD failed and adds to the error what could not be undone.
func (u *Undo) OnError(err *error) {
	if *err == nil {
		return
	}
	if uerr := u.Run(); uerr != nil {
		*err = fmt.Errorf("%w (and undoing the ADD failed: %v)", *err, uerr)
	}
}
