package loopback

import (
	"encoding/json"
	"fmt"
	"net"

	"github.com/containernetworking/cni/pkg/types"
	current "github.com/containernetworking/cni/pkg/types/100"

	"github.com/flatnet/flatnet/internal/cni/cnierr"
	"github.com/flatnet/flatnet/internal/cni/plugin"
)

// parseConf decodes loopback's config: only the generic keys matter
// (cniVersion, prevResult). A prevResult must be convertible to the current
// result type, as the reference plugin requires.
func parseConf(stdin []byte) (*types.NetConf, error) {
	conf := &types.NetConf{}
	if err := json.Unmarshal(stdin, conf); err != nil {
		return nil, cnierr.Wrap(cnierr.DecodingFailure, err, "loopback: decoding network config")
	}
	if conf.RawPrevResult != nil {
		if _, err := plugin.LoadPrevResult(conf); err != nil {
			return nil, err
		}
	}
	return conf, nil
}

// buildResult is what ADD reports: the prevResult unchanged when there is
// one (loopback changes nothing another plugin reported), otherwise lo with
// its first IPv4 and first IPv6 address. Every address must be a loopback
// address: anything else on lo means the namespace is not what we think.
func buildResult(conf *types.NetConf, netnsPath string, v4, v6 []net.IPNet) (types.Result, error) {
	for _, a := range append(append([]net.IPNet(nil), v4...), v6...) {
		if !a.IP.IsLoopback() {
			return nil, cnierr.New(cnierr.Internal, "loopback: lo in netns %s has non-loopback address %s", netnsPath, a.String())
		}
	}
	if conf.PrevResult != nil {
		return conf.PrevResult, nil
	}
	r := &current.Result{
		CNIVersion: current.ImplementedSpecVersion,
		Interfaces: []*current.Interface{{Name: ifName, Mac: "00:00:00:00:00:00", Sandbox: netnsPath}},
	}
	for _, list := range [][]net.IPNet{v4, v6} {
		if len(list) > 0 {
			r.IPs = append(r.IPs, &current.IPConfig{Interface: current.Int(0), Address: list[0]})
		}
	}
	return r, nil
}

// describe is for messages: "lo in netns PATH".
func describe(netnsPath string) string { return fmt.Sprintf("%s in netns %s", ifName, netnsPath) }
