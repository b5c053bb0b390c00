package server

import (
	"encoding/binary"
	"sync"
	"time"
)

// query is what the fast path reads from a query's bytes without unpacking
// it: where the question ends and what of EDNS0 the reply depends on.
type query struct {
	qEnd    int    // offset just past the question (type and class included)
	edns    bool   // the query carries an OPT record (version 0)
	do      bool   // its DNSSEC OK bit
	udpSize uint16 // its advertised UDP payload size
}

// Header bits the fast path copies from the query into a cached reply.
const (
	flagRD = 0x01 // byte 2
	flagCD = 0x10 // byte 3
)

// parseQuery reads a plain query: QR clear, opcode QUERY, one question whose
// name has no compression pointer, no answer or authority records, and at
// most an OPT record (version 0) in the additional section. Anything else
// (ok false) takes the slow path, which unpacks the message in full.
func parseQuery(b []byte) (query, bool) {
	var q query
	if len(b) < 12+5 {
		return q, false
	}
	if b[2]&0x80 != 0 || b[2]&0x78 != 0 || b[2]&0x02 != 0 { // QR, opcode, TC
		return q, false
	}
	if binary.BigEndian.Uint16(b[4:]) != 1 || binary.BigEndian.Uint16(b[6:]) != 0 || binary.BigEndian.Uint16(b[8:]) != 0 {
		return q, false
	}
	ar := binary.BigEndian.Uint16(b[10:])
	if ar > 1 {
		return q, false
	}
	off := 12
	for {
		if off >= len(b) {
			return q, false
		}
		l := int(b[off])
		if l == 0 {
			off++
			break
		}
		if l&0xC0 != 0 || off+1+l > len(b) {
			return q, false
		}
		off += 1 + l
	}
	if off+4 > len(b) || off-12 > 255 {
		return q, false
	}
	q.qEnd = off + 4
	if ar == 0 {
		return q, q.qEnd == len(b)
	}
	// The OPT record: root owner, type 41, class = UDP size, TTL =
	// extended rcode, version, flags; then its options.
	o := q.qEnd
	if o+11 > len(b) || b[o] != 0 || binary.BigEndian.Uint16(b[o+1:]) != 41 {
		return q, false
	}
	if b[o+6] != 0 { // EDNS version: only 0 exists; others get BADVERS
		return q, false
	}
	q.edns = true
	q.udpSize = binary.BigEndian.Uint16(b[o+3:])
	q.do = b[o+7]&0x80 != 0
	rdlen := int(binary.BigEndian.Uint16(b[o+9:]))
	return q, o+11+rdlen == len(b)
}

// maxSize is the largest reply the client takes over UDP: 512 bytes
// without EDNS0, else its advertised size (never below 512).
func (q query) maxSize() int {
	if !q.edns || q.udpSize < 512 {
		return 512
	}
	return int(q.udpSize)
}

// replyCache holds packed replies to questions the index answered alone,
// keyed by the question's bytes (name in the asker's spelling, type and
// class), the EDNS0 bits the reply depends on, and, with autopath, the
// asker's namespace. A hit is a copy and a patched header: no unpacking,
// no allocation. Entries are valid for the index generation they were built
// at; a change to the index makes every entry stale at once.
type replyCache struct {
	max int

	mu      sync.RWMutex
	entries map[string]cached
}

type cached struct {
	gen      uint64
	wire     []byte    // ID 0, RD and CD clear
	autopath bool      // an autopath answer (counted as one on every hit)
	expires  time.Time // forwarded replies: valid until then, whatever the generation
}

func newReplyCache(max int) *replyCache {
	return &replyCache{max: max, entries: make(map[string]cached, min(max, 1024))}
}

// cacheKey appends the key of query b to dst.
func cacheKey(dst []byte, b []byte, q query, ns string) []byte {
	dst = append(dst, b[12:q.qEnd]...)
	var f byte
	if q.edns {
		f |= 1
	}
	if q.do {
		f |= 2
	}
	dst = append(dst, f)
	return append(dst, ns...)
}

func (c *replyCache) get(key []byte, gen uint64, now time.Time) (cached, bool) {
	c.mu.RLock()
	e, ok := c.entries[string(key)]
	c.mu.RUnlock()
	if !ok {
		return cached{}, false
	}
	if e.expires.IsZero() && e.gen != gen || !e.expires.IsZero() && !now.Before(e.expires) {
		return cached{}, false
	}
	return e, true
}

// put stores e with a copy of reply (packed, untruncated) under key.
func (c *replyCache) put(key []byte, e cached, reply []byte) {
	w := append([]byte(nil), reply...)
	w[0], w[1] = 0, 0
	w[2] &^= flagRD
	w[3] &^= flagCD
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.entries[string(key)]; !ok && len(c.entries) >= c.max {
		// Full: evict one entry, whichever the map yields first (Go
		// randomises where ranging starts).
		for k := range c.entries {
			delete(c.entries, k)
			break
		}
	}
	e.wire = w
	c.entries[string(key)] = e
}

func (c *replyCache) len() int {
	c.mu.RLock()
	defer c.mu.RUnlock()
	return len(c.entries)
}

// fromCache writes into dst the cached reply w for query b: the query's ID,
// RD and CD bits.
func fromCache(dst, w, b []byte) []byte {
	dst = append(dst[:0], w...)
	dst[0], dst[1] = b[0], b[1]
	dst[2] |= b[2] & flagRD
	dst[3] |= b[3] & flagCD
	return dst
}
