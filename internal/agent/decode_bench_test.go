package agent

import (
	"bytes"
	"encoding/json"
	"os"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime/serializer/protobuf"
	"k8s.io/client-go/kubernetes/scheme"
)

// kwokNodeProto is testdata/kwok-node.json (a Node as kwok keeps it in
// make bench-scale's lab: its managedFields, conditions, capacity and
// nodeInfo) as the API server sends it to the agent: protobuf.
func kwokNodeProto(b *testing.B) []byte {
	raw, err := os.ReadFile("testdata/kwok-node.json")
	if err != nil {
		b.Fatal(err)
	}
	var n corev1.Node
	if err := json.Unmarshal(raw, &n); err != nil {
		b.Fatal(err)
	}
	var buf bytes.Buffer
	if err := protobuf.NewSerializer(scheme.Scheme, scheme.Scheme).Encode(&n, &buf); err != nil {
		b.Fatal(err)
	}
	return buf.Bytes()
}

// What receiving one Node event costs the agent before any handler: its
// protobuf decode and the informer's transform (trimNode). Set against
// the ~330 µs a bare client-go watch spends per Node event in make
// bench-scale (docs/scale.md), it says where that cost is not.
func BenchmarkNodeDecode(b *testing.B) {
	data := kwokNodeProto(b)
	s := protobuf.NewSerializer(scheme.Scheme, scheme.Scheme)
	b.ReportAllocs()
	b.SetBytes(int64(len(data)))
	for b.Loop() {
		obj, _, err := s.Decode(data, nil, nil)
		if err != nil {
			b.Fatal(err)
		}
		if _, err := trimNode(obj); err != nil {
			b.Fatal(err)
		}
	}
}
