package bandwidth

import (
	"testing"

	"github.com/flatnet/flatnet/internal/cni/cnierr"
	"github.com/flatnet/flatnet/internal/cni/plugin"
)

// No input may panic the parser or the planner, and every rejection is a
// classified CNI error (never 999).
func FuzzParseConfig(f *testing.F) {
	for _, s := range []string{
		`{"cniVersion":"1.0.0","name":"n","type":"bandwidth","ingressRate":10000000,"ingressBurst":100000,"egressRate":10000000,"egressBurst":100000}`,
		`{"cniVersion":"1.1.0","name":"n","type":"bandwidth","capabilities":{"bandwidth":true},"runtimeConfig":{"bandwidth":{"ingressRate":10000000,"ingressBurst":4294967295}}}`,
		`{"cniVersion":"1.0.0","name":"n","ingressRate":-1}`,
		`{"cniVersion":"1.0.0","name":"n","egressRate":8,"egressBurst":34359738359}`,
		`{"cniVersion":"0.4.0","name":"n","prevResult":{"cniVersion":"0.4.0","interfaces":[{"name":"veth1"}],"ips":[{"version":"4","address":"10.1.2.3/24","interface":0}]}}`,
		`{"cniVersion":"1.1.0","name":"n","cni.dev/valid-attachments":[{"containerID":"c","ifname":"eth0"}]}`,
		`{`, `null`, `[]`, `""`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		for _, strict := range []bool{true, false} {
			cfg, err := parseConfig(data, strict)
			if err != nil {
				if code, ok := cnierr.Code(err); !ok || code == cnierr.Internal {
					t.Fatalf("unclassified error for %q: %v", data, err)
				}
				continue
			}
			if strict {
				p, err := NewPlan(cfg, Owner{cfg.Name, "c", "eth0"}, veth, clock)
				if err == nil && (p.Egress != nil) != (p.IFB != "") {
					t.Fatalf("plan with egress %v but IFB %q", p.Egress, p.IFB)
				}
			}
			_, _ = plugin.PrevResult(&cfg.NetConf)
		}
		_, _ = plugin.ValidAttachments(data)
	})
}
