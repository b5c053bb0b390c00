package forward

import (
	"testing"
	"time"

	"github.com/miekg/dns"
)

// FuzzCache feeds arbitrary upstream answers through Set and Get: nothing
// panics, and what is served carries the client's ID and question and no TTL
// above the cap.
func FuzzCache(f *testing.F) {
	for _, m := range seedAnswers(f) {
		b, err := m.Pack()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, uint16(30))
	}
	f.Fuzz(func(t *testing.T, packed []byte, ageSeconds uint16) {
		resp := new(dns.Msg)
		if resp.Unpack(packed) != nil || len(resp.Question) != 1 {
			return
		}
		req := new(dns.Msg)
		req.Id = resp.Id + 1
		req.Question = []dns.Question{resp.Question[0]}
		clk := newClock()
		c := NewCache(2, clk.Now)
		stored := c.Set(req, resp)
		clk.Advance(time.Duration(ageSeconds) * time.Second)
		got := c.Get(req)
		if got == nil {
			return
		}
		if !stored {
			t.Fatal("served an answer that was never stored")
		}
		if got.Id != req.Id || len(got.Question) != 1 || got.Question[0] != req.Question[0] {
			t.Fatalf("served ID %d question %v, want the client's %d %v", got.Id, got.Question, req.Id, req.Question)
		}
		for _, sec := range [][]dns.RR{got.Answer, got.Ns, got.Extra} {
			for _, rr := range sec {
				if rr.Header().Rrtype == dns.TypeOPT {
					t.Fatal("OPT served from the cache")
				}
				if rr.Header().Ttl > uint32(MaxPositiveTTL/time.Second) {
					t.Fatalf("TTL %d above the cap: %v", rr.Header().Ttl, rr)
				}
			}
		}
	})
}

func seedAnswers(tb testing.TB) []*dns.Msg {
	q := new(dns.Msg).SetQuestion("www.example.com.", dns.TypeA)
	pos := new(dns.Msg).SetReply(q)
	pos.Answer = []dns.RR{mustRR(tb, "www.example.com. 60 IN A 198.51.100.7")}
	pos.SetEdns0(4096, true)
	nx := new(dns.Msg).SetRcode(q, dns.RcodeNameError)
	nx.Ns = []dns.RR{mustRR(tb, "example.com. 300 IN SOA ns.example.com. admin.example.com. 1 7200 900 1209600 60")}
	return []*dns.Msg{pos, nx, new(dns.Msg).SetRcode(q, dns.RcodeServerFailure)}
}
