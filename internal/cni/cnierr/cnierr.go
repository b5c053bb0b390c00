// Package cnierr carries CNI error codes through ordinary Go error chains.
//
// Plugins wrap failures with %w as usual; the code that the CNI spec (or a
// flatnet plugin) assigns to a failure rides along in an *Error somewhere in
// the chain. At the process edge, ToTypes turns the whole chain into the
// spec's error JSON: the code of the outermost *Error, and the full message,
// so the runtime's log says both what failed and where.
package cnierr

import (
	"context"
	"errors"
	"fmt"

	"github.com/containernetworking/cni/pkg/types"
)

// Codes reserved by the CNI spec (SPEC.md, "Error").
const (
	IncompatibleVersion uint = types.ErrIncompatibleCNIVersion      // 1
	UnsupportedField    uint = types.ErrUnsupportedField            // 2
	UnknownContainer    uint = types.ErrUnknownContainer            // 3
	InvalidEnvironment  uint = types.ErrInvalidEnvironmentVariables // 4
	IOFailure           uint = types.ErrIOFailure                   // 5
	DecodingFailure     uint = types.ErrDecodingFailure             // 6
	InvalidConfig       uint = types.ErrInvalidNetworkConfig        // 7
	InvalidNetNS        uint = types.ErrInvalidNetNS                // 8
	TryAgainLater       uint = types.ErrTryAgainLater               // 11
	PluginNotAvailable  uint = types.ErrPluginNotAvailable          // 50
	LimitedConnectivity uint = types.ErrLimitedConnectivity         // 51
	Internal            uint = types.ErrInternal                    // 999
)

// flatnet's plugin-specific codes (100 and up). Documented in docs/cni.md.
const (
	// RangeExhausted: host-local has no free address left in a range set.
	RangeExhausted uint = 101
	// AddressInUse: a requested static IP (ips capability or IP= arg) is
	// already reserved by another attachment.
	AddressInUse uint = 102
	// AddressNotInRange: a requested static IP lies outside every range.
	AddressNotInRange uint = 103
	// InterfaceExists: CNI_IFNAME already exists in the container netns.
	InterfaceExists uint = 104
	// KernelFeatureMissing: the kernel lacks a facility the config needs
	// (a qdisc, a link type, nftables and iptables both missing...).
	KernelFeatureMissing uint = 105
	// CheckFailed: CHECK found a resource missing or different from the
	// result ADD reported.
	CheckFailed uint = 106
)

// Error is an error with a CNI code. Msg says what went wrong; Err, if set,
// is the cause and is included in Error().
type Error struct {
	Code    uint
	Msg     string
	Details string
	Err     error
}

func (e *Error) Error() string {
	switch {
	case e.Msg == "" && e.Err != nil:
		return e.Err.Error()
	case e.Err != nil:
		return e.Msg + ": " + e.Err.Error()
	default:
		return e.Msg
	}
}

func (e *Error) Unwrap() error { return e.Err }

// New returns an error with code and a formatted message. %w verbs in format
// are honoured (the wrapped error stays reachable through errors.Is/As).
func New(code uint, format string, args ...any) error {
	return &Error{Code: code, Err: fmt.Errorf(format, args...)}
}

// Wrap gives err a code, keeping it unwrappable. A nil err stays nil.
func Wrap(code uint, err error, format string, args ...any) error {
	if err == nil {
		return nil
	}
	return &Error{Code: code, Msg: fmt.Sprintf(format, args...), Err: err}
}

// Code returns the code of the outermost *Error in err's chain, and
// whether there was one. A chain with no code that holds an expired
// deadline (a stuck nft or iptables-restore killed by internal/execx) is
// 11, try again later: the tool, not the request, was the problem.
func Code(err error) (uint, bool) {
	var e *Error
	if errors.As(err, &e) {
		return e.Code, true
	}
	var te *types.Error
	if errors.As(err, &te) {
		return te.Code, true
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return TryAgainLater, true
	}
	return 0, false
}

// ToTypes converts any error into the CNI error result. Errors that carry
// no code are internal failures (999): a code we forgot to assign shows up
// as 999 in tests, which check for the specific codes.
func ToTypes(err error) *types.Error {
	if err == nil {
		return nil
	}
	var te *types.Error
	if errors.As(err, &te) && te == err {
		return te
	}
	code, ok := Code(err)
	if !ok {
		code = Internal
	}
	details := ""
	var e *Error
	if errors.As(err, &e) {
		details = e.Details
	}
	return &types.Error{Code: code, Msg: err.Error(), Details: details}
}
