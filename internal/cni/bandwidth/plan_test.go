package bandwidth

import (
	"strings"
	"testing"

	"github.com/flatnet/flatnet/internal/cni/cnierr"
	"github.com/flatnet/flatnet/internal/tc"
)

var clock = tc.Clock{TicksPerUsec: 15.625}

func TestIFBNameMatchesReference(t *testing.T) {
	// Vectors from ("bwp" + sha512(network + containerID).hexdigest())[:15],
	// the reference's utils.MustFormatHashWithPrefix(15, "bwp", ...).
	for _, tt := range []struct{ network, id, want string }{
		{"mynet", "dummy", "bwp1b29d9511ed2"},
		{"k8s-pod-network", "0123456789abcdef", "bwpafb0649f8646"},
	} {
		if got := IFBName(tt.network, tt.id); got != tt.want {
			t.Errorf("IFBName(%q, %q) = %q, want %q", tt.network, tt.id, got, tt.want)
		}
		if !isReferenceIFBName(tt.want) {
			t.Errorf("isReferenceIFBName(%q) = false", tt.want)
		}
	}
	for _, n := range []string{"bwp1b29d9511ed", "bwp1b29d9511eDZ", "xwp1b29d9511ed2", "eth0"} {
		if isReferenceIFBName(n) {
			t.Errorf("isReferenceIFBName(%q) = true", n)
		}
	}
}

func TestAliasRoundTrip(t *testing.T) {
	o := Owner{"k8s-pod-network", "0123abc", "eth0"}
	if got := o.Alias(); got != "flatnet-bw:k8s-pod-network:0123abc:eth0" {
		t.Errorf("Alias() = %q", got)
	}
	for _, o := range []Owner{o, {"n", "c", "net1:x"}} {
		back, ok := parseAlias(o.Alias())
		if !ok || back != o {
			t.Errorf("parseAlias(%q) = %+v, %v", o.Alias(), back, ok)
		}
	}
	for _, a := range []string{"", "flatnet-bw:", "flatnet-bw:n:c", "flatnet-bw:n::eth0", "other:n:c:eth0"} {
		if _, ok := parseAlias(a); ok {
			t.Errorf("parseAlias(%q) accepted", a)
		}
	}
}

var veth = tc.Link{Index: 7, Name: "veth1234", Kind: "veth", MTU: 1500}

func TestNewPlan(t *testing.T) {
	owner := Owner{"net", "ctr", "eth0"}
	cfg := &Config{Ingress: Limit{10_000_000, 100_000}, Egress: Limit{20_000_000, 200_000}}
	p, err := NewPlan(cfg, owner, veth, clock)
	if err != nil {
		t.Fatal(err)
	}
	in, _ := clock.TBFFor(10_000_000, 100_000)
	eg, _ := clock.TBFFor(20_000_000, 200_000)
	if p.Ingress == nil || *p.Ingress != in || p.Egress == nil || *p.Egress != eg {
		t.Errorf("plan TBFs %v %v, want %v %v", p.Ingress, p.Egress, in, eg)
	}
	if p.IFB != IFBName("net", "ctr") || p.Alias != "flatnet-bw:net:ctr:eth0" || p.Host != veth {
		t.Errorf("plan %+v", p)
	}

	// Ingress only: no IFB at all, as in the reference.
	p, err = NewPlan(&Config{Ingress: Limit{10_000_000, 100_000}}, owner, veth, clock)
	if err != nil {
		t.Fatal(err)
	}
	if p.Egress != nil || p.IFB != "" {
		t.Errorf("ingress-only plan has egress parts: %+v", p)
	}
}

func TestNewPlanRejects(t *testing.T) {
	owner := Owner{"net", "ctr", "eth0"}
	for _, tt := range []struct {
		name  string
		cfg   Config
		owner Owner
		code  uint
		msg   string
	}{
		{"burst below MTU", Config{Ingress: Limit{10_000_000, 8_000}}, owner, 7, "ingressBurst 8000 bits"},
		{"egress burst below MTU", Config{Egress: Limit{10_000_000, 11_992}}, owner, 7, "raise egressBurst to at least 12000 bits"},
		// 1 byte/s for at most 4.29 s (the kernel's cap) is a 4-byte bucket.
		{"bucket capped below MTU", Config{Egress: Limit{8, 1_000_000}}, owner, 7, "4-byte bucket"},
		{"alias too long", Config{Egress: Limit{10_000_000, 100_000}}, Owner{strings.Repeat("n", 200), strings.Repeat("c", 64), "eth0"}, 7, "too long"},
	} {
		t.Run(tt.name, func(t *testing.T) {
			_, err := NewPlan(&tt.cfg, tt.owner, veth, clock)
			if code, _ := cnierr.Code(err); code != tt.code || !strings.Contains(err.Error(), tt.msg) {
				t.Errorf("got %v (code %d), want code %d mentioning %q", err, code, tt.code, tt.msg)
			}
		})
	}
	// Exactly one MTU is enough.
	if _, err := NewPlan(&Config{Ingress: Limit{10_000_000, 12_000}}, owner, veth, clock); err != nil {
		t.Errorf("burst of exactly one MTU: %v", err)
	}
	if _, err := NewPlan(&Config{Ingress: Limit{10_000_000, 12_000}}, owner, veth, tc.Clock{}); err == nil {
		t.Errorf("no clock: want an error")
	} else if code, _ := cnierr.Code(err); code != 105 {
		t.Errorf("no clock: code %d, want 105", code)
	}
}
