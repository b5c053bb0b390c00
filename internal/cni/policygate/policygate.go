// Package policygate is the `flatnet-policy` CNI plugin: chained after the
// plugin that gives a pod its addresses (bridge, ptp), its ADD asks the
// node agent (`flatnet agent --network-policy`) to commit the pod's
// network policy for those addresses and returns only when the agent has
// (internal/netpol/gate). Runtimes start a pod's containers after CNI ADD
// returns, so no packet of the pod passes before its policy exists.
//
// Config:
//
//	{"type": "flatnet-policy", "socket": "/run/flatnet/policy.sock", "timeoutSeconds": 10}
//
// ADD fails (code 11, try again later) when the agent does not answer in
// time: a pod must not start unprotected, and the runtime retries the
// sandbox. A container that is not a Kubernetes pod (no K8S_POD_NAME in
// CNI_ARGS) cannot be selected by a policy and passes. DEL, GC and CHECK
// have nothing of their own to undo or check (the agent drops a pod's
// rules when the pod goes away); STATUS says whether the agent listens.
package policygate

import (
	"context"
	"encoding/json"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/containernetworking/cni/pkg/skel"
	"github.com/containernetworking/cni/pkg/types"

	"github.com/flatnet/flatnet/internal/cni/cnierr"
	"github.com/flatnet/flatnet/internal/cni/plugin"
	"github.com/flatnet/flatnet/internal/netpol/gate"
)

// Name is the plugin's type name.
const Name = "flatnet-policy"

// DefaultSocket is where the agent listens unless told otherwise.
const DefaultSocket = "/run/flatnet/policy.sock"

// Plugin is flatnet-policy as a CNI plugin.
var Plugin = plugin.Plugin{Name: Name, Funcs: skel.CNIFuncs{
	Add:    cmdAdd,
	Del:    func(*skel.CmdArgs) error { return nil },
	Check:  cmdCheck,
	GC:     func(*skel.CmdArgs) error { return nil },
	Status: cmdStatus,
}}

// Config is the plugin's configuration.
type Config struct {
	types.NetConf
	Socket         string `json:"socket"`
	TimeoutSeconds int    `json:"timeoutSeconds"`
}

func parseConfig(stdin []byte) (*Config, error) {
	c := &Config{}
	if err := json.Unmarshal(stdin, c); err != nil {
		return nil, cnierr.Wrap(cnierr.DecodingFailure, err, "%s: decoding network config", Name)
	}
	if c.Socket == "" {
		c.Socket = DefaultSocket
	}
	if c.TimeoutSeconds < 0 || c.TimeoutSeconds > 600 {
		return nil, cnierr.New(cnierr.InvalidConfig, "%s: timeoutSeconds %d is out of range (0-600; 0 means 10)", Name, c.TimeoutSeconds)
	}
	if c.TimeoutSeconds == 0 {
		c.TimeoutSeconds = 10
	}
	return c, nil
}

// podName reads K8S_POD_NAMESPACE, K8S_POD_NAME and K8S_POD_UID from
// CNI_ARGS.
func podName(args string) (ns, name, uid string) {
	for kv := range strings.SplitSeq(args, ";") {
		k, v, _ := strings.Cut(kv, "=")
		switch k {
		case "K8S_POD_NAMESPACE":
			ns = v
		case "K8S_POD_NAME":
			name = v
		case "K8S_POD_UID":
			uid = v
		}
	}
	return ns, name, uid
}

func cmdAdd(args *skel.CmdArgs) error {
	conf, err := parseConfig(args.StdinData)
	if err != nil {
		return err
	}
	prev, err := plugin.LoadPrevResult(&conf.NetConf)
	if err != nil {
		return err
	}
	if prev == nil {
		return cnierr.New(cnierr.InvalidConfig, "%s: no prevResult: chain it after the plugin that gives the pod its addresses (bridge, ptp)", Name)
	}
	req := gate.Request{ContainerID: args.ContainerID}
	req.Namespace, req.Name, req.UID = podName(args.Args)
	for _, ip := range prev.IPs {
		if a, ok := netip.AddrFromSlice(ip.Address.IP); ok {
			req.IPs = append(req.IPs, a.Unmap())
		}
	}
	if req.Namespace != "" && req.Name != "" && len(req.IPs) > 0 {
		ctx, cancel := context.WithTimeout(context.Background(), time.Duration(conf.TimeoutSeconds)*time.Second)
		defer cancel()
		if err := gate.Ask(ctx, conf.Socket, req); err != nil {
			return cnierr.Wrap(cnierr.TryAgainLater, err,
				"%s: pod %s/%s must not start before its network policy is in place; is `flatnet agent --network-policy` running on this node", Name, req.Namespace, req.Name)
		}
	}
	return plugin.PrintResult(prev, conf.CNIVersion)
}

func cmdCheck(args *skel.CmdArgs) error {
	conf, err := parseConfig(args.StdinData)
	if err != nil {
		return err
	}
	if prev, err := plugin.LoadPrevResult(&conf.NetConf); err != nil {
		return err
	} else if prev == nil {
		return cnierr.New(cnierr.InvalidConfig, "%s: CHECK without prevResult", Name)
	}
	return nil
}

func cmdStatus(args *skel.CmdArgs) error {
	conf, err := parseConfig(args.StdinData)
	if err != nil {
		return err
	}
	if fi, err := os.Stat(conf.Socket); err != nil || fi.Mode().Type() != os.ModeSocket {
		return cnierr.New(cnierr.PluginNotAvailable, "%s: the flatnet agent's policy gate %s is not there: start `flatnet agent --network-policy` on this node", Name, conf.Socket)
	}
	return nil
}
