package tc

import (
	"errors"
	"fmt"
)

// Link is what tc needs to know of a network interface.
type Link struct {
	Index int
	Name  string
	Kind  string // "ifb", "veth", ...
	Alias string
	MAC   string
	MTU   int
	Up    bool // administratively up
	// Parent is IFLA_LINK: for a veth, its peer's index (in the peer's
	// namespace).
	Parent int
}

// Kernel is the traffic-control surface the bandwidth plugin uses, one
// method per netlink request. Netlink implements it for real; Fake in
// memory. All link arguments are interface indexes in the caller's netns.
type Kernel interface {
	// AddIFB creates an IFB device, up, with the given alias and MTU. It
	// fails with an error matching ErrExist when the name is taken.
	AddIFB(name, alias string, mtu int) (Link, error)
	// LinkByName finds a link; ok is false when there is none.
	LinkByName(name string) (l Link, ok bool, err error)
	// LinkByIndex finds a link; ok is false when there is none.
	LinkByIndex(index int) (l Link, ok bool, err error)
	// IFBs lists every IFB device.
	IFBs() ([]Link, error)
	// DeleteLink removes a link; a missing link is not an error.
	DeleteLink(index int) error

	// SetRootTBF installs (or replaces) t as the root qdisc, handle 1:.
	SetRootTBF(link int, t TBF) error
	// RootTBF returns the root qdisc's parameters; ok is false when the
	// root qdisc is not a TBF.
	RootTBF(link int) (t TBF, ok bool, err error)
	// DeleteRoot removes the root qdisc (the kernel's default returns).
	// A missing one is not an error.
	DeleteRoot(link int) error

	// AddIngress adds the ingress qdisc (ffff:). It fails with an error
	// matching ErrExist when there already is one.
	AddIngress(link int) error
	// HasIngress reports whether link has an ingress qdisc.
	HasIngress(link int) (bool, error)
	// DeleteIngress removes the ingress qdisc and its filters. A missing
	// one is not an error.
	DeleteIngress(link int) error
	// AddRedirect adds a match-all u32 filter under link's ingress qdisc
	// whose action redirects every packet to the egress of device to.
	AddRedirect(link, to int) error
	// Redirects lists the devices that link's ingress filters redirect to.
	Redirects(link int) ([]int, error)
	// AllRedirects maps every redirect target in the namespace to the links
	// redirecting to it.
	AllRedirects() (map[int][]int, error)
}

// ErrExist is matched (errors.Is) by errors for objects that already exist.
var ErrExist = errors.New("already exists")

// FeatureError says that the kernel lacks a facility.
type FeatureError struct {
	Feature string // what is missing, e.g. "IFB devices"
	Hint    string // how to get it, e.g. "modprobe ifb (CONFIG_IFB)"
	Err     error
}

func (e *FeatureError) Error() string {
	return fmt.Sprintf("the kernel does not support %s (%v): %s", e.Feature, e.Err, e.Hint)
}

func (e *FeatureError) Unwrap() error { return e.Err }

// The facilities the bandwidth plugin needs, for FeatureError.
var (
	FeatureIFB      = [2]string{"IFB devices", "load the ifb module (modprobe ifb) or build the kernel with CONFIG_IFB"}
	FeatureTBF      = [2]string{"the TBF qdisc", "load sch_tbf (modprobe sch_tbf) or build with CONFIG_NET_SCH_TBF"}
	FeatureIngress  = [2]string{"the ingress qdisc", "load sch_ingress (modprobe sch_ingress) or build with CONFIG_NET_SCH_INGRESS"}
	FeatureRedirect = [2]string{"u32 filters with the mirred action", "load cls_u32 and act_mirred or build with CONFIG_NET_CLS_U32 and CONFIG_NET_ACT_MIRRED"}
)

func featureErr(f [2]string, err error) error {
	return &FeatureError{Feature: f[0], Hint: f[1], Err: err}
}
