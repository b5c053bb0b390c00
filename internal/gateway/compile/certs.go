package compile

import (
	"crypto/sha256"
	"crypto/tls"
	"fmt"
	"sync"

	"k8s.io/apimachinery/pkg/types"
)

// Parsing a key pair costs far more than the rest of a Compile (an RSA key
// is validated on load), and Compile runs on every change, so parsed pairs
// are kept by the hash of their PEM: the same bytes always give the same
// certificate, so the cache cannot change an answer, and a rotated Secret
// has new bytes.
var keyPairs struct {
	mu sync.Mutex // protects m
	m  map[[sha256.Size]byte]keyPairResult
}

type keyPairResult struct {
	cert *tls.Certificate
	err  error
}

// keyPairCacheMax bounds the cache; it is dropped whole when full.
const keyPairCacheMax = 4096

func loadKeyPair(k types.NamespacedName, crt, key []byte) (*tls.Certificate, error) {
	h := sha256.New()
	h.Write(crt)
	h.Write([]byte{0})
	h.Write(key)
	var sum [sha256.Size]byte
	h.Sum(sum[:0])

	keyPairs.mu.Lock()
	r, ok := keyPairs.m[sum]
	keyPairs.mu.Unlock()
	if !ok {
		cert, err := tls.X509KeyPair(crt, key)
		r = keyPairResult{err: err}
		if err == nil {
			r.cert = &cert
		}
		keyPairs.mu.Lock()
		if keyPairs.m == nil || len(keyPairs.m) >= keyPairCacheMax {
			keyPairs.m = map[[sha256.Size]byte]keyPairResult{}
		}
		keyPairs.m[sum] = r
		keyPairs.mu.Unlock()
	}
	if r.err != nil {
		return nil, fmt.Errorf("Secret %s does not hold a valid PEM certificate and key: %w", k, r.err)
	}
	return r.cert, nil
}
