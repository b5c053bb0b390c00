package proxy

import (
	"io"
	"net/http"
	"strconv"
	"sync"
	"time"
	"unicode/utf8"
)

// accessLog writes one JSON line for the finished request, built in st's
// reused buffer.
func (st *reqState) accessLog(r *http.Request, code int) {
	now := time.Now()
	b := st.logBuf[:0]
	b = append(b, `{"time":"`...)
	b = now.UTC().AppendFormat(b, time.RFC3339Nano)
	b = append(b, `","method":`...)
	b = appendJSON(b, r.Method)
	b = append(b, `,"host":`...)
	b = appendJSON(b, r.Host)
	b = append(b, `,"path":`...)
	b = appendJSON(b, r.URL.Path)
	b = append(b, `,"status":`...)
	b = strconv.AppendInt(b, int64(code), 10)
	b = append(b, `,"bytes":`...)
	b = strconv.AppendInt(b, st.rw.bytes, 10)
	b = append(b, `,"duration":`...)
	b = strconv.AppendFloat(b, now.Sub(st.start).Seconds(), 'f', 6, 64)
	b = append(b, `,"route":`...)
	route, backend := "", ""
	if st.a != nil {
		route = st.a.Route
	}
	if st.b != nil {
		backend = st.b.Name
	}
	b = appendJSON(b, route)
	b = append(b, `,"backend":`...)
	b = appendJSON(b, backend)
	b = append(b, `,"endpoint":`...)
	b = appendJSON(b, st.ep)
	b = append(b, `,"client":`...)
	b = appendJSON(b, r.RemoteAddr)
	b = append(b, "}\n"...)
	st.logBuf = b
	st.s.alog.write(b)
}

// logBuffer collects access log lines and writes them in batches: at
// 64 KiB, every flushEvery and at Close, not one write(2) per request.
type logBuffer struct {
	mu  sync.Mutex // protects buf, and orders writes to w
	w   io.Writer
	buf []byte
}

const (
	logBatch   = 64 << 10
	flushEvery = 100 * time.Millisecond
)

func (l *logBuffer) write(line []byte) {
	l.mu.Lock()
	l.buf = append(l.buf, line...)
	if len(l.buf) >= logBatch {
		l.flushLocked()
	}
	l.mu.Unlock()
}

func (l *logBuffer) flush() {
	l.mu.Lock()
	l.flushLocked()
	l.mu.Unlock()
}

func (l *logBuffer) flushLocked() {
	if len(l.buf) > 0 {
		l.w.Write(l.buf) // an access log that cannot be written is not a reason to fail requests
		l.buf = l.buf[:0]
	}
}

// run flushes every flushEvery until done is closed, then once more.
func (l *logBuffer) run(done <-chan struct{}) {
	t := time.NewTicker(flushEvery)
	defer t.Stop()
	for {
		select {
		case <-done:
			l.flush()
			return
		case <-t.C:
			l.flush()
		}
	}
}

const hexDigits = "0123456789abcdef"

// appendJSON appends s as a JSON string: control characters, quotes and
// backslashes escaped, invalid UTF-8 replaced.
func appendJSON(b []byte, s string) []byte {
	b = append(b, '"')
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			switch {
			case c == '"' || c == '\\':
				b = append(b, '\\', c)
			case c < 0x20:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			default:
				b = append(b, c)
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, `\ufffd`...)
		} else {
			b = append(b, s[i:i+size]...)
		}
		i += size
	}
	return append(b, '"')
}
