package nfnl

// The netlink socket: one NETLINK_NETFILTER socket, a batch sent in one
// sendmsg, the kernel's answers read back.
//
// Batch messages carry no NLM_F_ACK, as with nft: the kernel answers only
// failures. It processes a batch inside our sendmsg, so its errors are
// queued before sendmsg returns; a GETGEN request sent right after then
// marks the end of them (its reply comes after every error). Acking each
// message instead (as google/nftables' Conn does) queues one ack per
// message: 100,000 of them overflow any sane receive buffer.

import (
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"sync"
	"syscall"

	"github.com/mdlayher/netlink"
	"golang.org/x/sys/unix"

	"github.com/flatnet/flatnet/internal/netns"
)

type conn struct {
	mu  sync.Mutex // one exchange at a time
	fd  int
	seq uint32
	buf []byte
}

// dial opens the socket, in the network namespace at nsPath when not "".
func dial(nsPath string) (*conn, error) {
	var fd int
	open := func() error {
		var err error
		fd, err = unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_NETFILTER)
		if err != nil {
			return os.NewSyscallError("socket", err)
		}
		return nil
	}
	var err error
	if nsPath != "" {
		err = netns.Do(nsPath, open)
	} else {
		err = open()
	}
	if err != nil {
		return nil, err
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK}); err != nil {
		unix.Close(fd)
		return nil, os.NewSyscallError("bind", err)
	}
	// Errors without the failing message echoed back, with the kernel's
	// explanation when it has one.
	_ = unix.SetsockoptInt(fd, unix.SOL_NETLINK, unix.NETLINK_CAP_ACK, 1)
	_ = unix.SetsockoptInt(fd, unix.SOL_NETLINK, unix.NETLINK_EXT_ACK, 1)
	_ = unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 4<<20)
	// The buffer grows to the largest message seen (recv peeks first).
	return &conn{fd: fd, buf: make([]byte, 64<<10)}, nil
}

func (c *conn) close() error { return unix.Close(c.fd) }

const (
	nfnlSubsys = unix.NFNL_SUBSYS_NFTABLES << 8
	nlmsgHdr   = 16
)

// appendMsg appends one netlink message (header, nfgenmsg, attributes).
func appendMsg(b []byte, typ uint16, flags netlink.HeaderFlags, seq uint32, family byte, resID uint16, data []byte) []byte {
	n := nlmsgHdr + 4 + len(data)
	b = binary.NativeEndian.AppendUint32(b, uint32(n))
	b = binary.NativeEndian.AppendUint16(b, typ)
	b = binary.NativeEndian.AppendUint16(b, uint16(flags))
	b = binary.NativeEndian.AppendUint32(b, seq)
	b = binary.NativeEndian.AppendUint32(b, 0)
	b = append(b, family, unix.NFNETLINK_V0)
	b = binary.BigEndian.AppendUint16(b, resID)
	b = append(b, data...)
	for len(b)%4 != 0 {
		b = append(b, 0)
	}
	return b
}

// opError is a message the kernel refused.
type opError struct {
	errno syscall.Errno
	msg   string // extack message, if any
	seq   uint32
}

// reply is one message read back.
type reply struct {
	typ   uint16
	flags uint16
	seq   uint32
	data  []byte // after the nfgenmsg header
}

// commit sends msgs as one batch and returns the kernel's refusals.
func (c *conn) commit(family byte, msgs []msg) (first uint32, errs []opError, err error) {
	return c.send1(family, msgs, true)
}

// send1 sends msgs as one batch; without its end message (end false) the
// kernel checks the batch and aborts it, as for `nft --check`.
func (c *conn) send1(family byte, msgs []msg, end bool) (first uint32, errs []opError, err error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	size := 0
	for _, m := range msgs {
		size += nlmsgHdr + 4 + len(m.data) + 3
	}
	b := make([]byte, 0, size+3*(nlmsgHdr+4))
	c.seq++
	b = appendMsg(b, unix.NFNL_MSG_BATCH_BEGIN, netlink.Request, c.seq, unix.AF_UNSPEC, unix.NFNL_SUBSYS_NFTABLES, nil)
	first = c.seq + 1
	for _, m := range msgs {
		c.seq++
		b = appendMsg(b, nfnlSubsys|m.typ, m.flags, c.seq, family, 0, m.data)
	}
	if end {
		c.seq++
		b = appendMsg(b, unix.NFNL_MSG_BATCH_END, netlink.Request, c.seq, unix.AF_UNSPEC, unix.NFNL_SUBSYS_NFTABLES, nil)
	}
	// The whole batch goes in one datagram; the kernel refuses one larger
	// than the send buffer.
	if err := unix.SetsockoptInt(c.fd, unix.SOL_SOCKET, unix.SO_SNDBUFFORCE, len(b)+4096); err != nil {
		_ = unix.SetsockoptInt(c.fd, unix.SOL_SOCKET, unix.SO_SNDBUF, len(b)+4096)
	}
	if err := c.send(b); err != nil {
		return first, nil, err
	}
	_, errs, err = c.request(unix.NFT_MSG_GETGEN, 0, family, nil)
	return first, errs, err
}

func (c *conn) send(b []byte) error {
	for {
		err := unix.Sendto(c.fd, b, 0, &unix.SockaddrNetlink{Family: unix.AF_NETLINK})
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return os.NewSyscallError("sendto", err)
		}
		return nil
	}
}

// request sends one non-batch request (a dump when flags has Dump) and
// reads until its answer is complete. Errors of earlier batch messages
// read on the way are returned in errs; err is the request's own failure.
func (c *conn) request(typ uint16, flags netlink.HeaderFlags, family byte, data []byte) (replies []reply, errs []opError, err error) {
	c.seq++
	seq := c.seq
	if err := c.send(appendMsg(nil, nfnlSubsys|typ, netlink.Request|netlink.Acknowledge|flags, seq, family, 0, data)); err != nil {
		return nil, nil, err
	}
	for {
		n, _, err := unix.Recvfrom(c.fd, c.buf, unix.MSG_PEEK|unix.MSG_TRUNC)
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, errs, os.NewSyscallError("recvfrom", err)
		}
		if n > len(c.buf) {
			c.buf = make([]byte, n)
		}
		n, _, err = unix.Recvfrom(c.fd, c.buf, 0)
		if err != nil {
			return nil, errs, os.NewSyscallError("recvfrom", err)
		}
		for b := c.buf[:n]; len(b) >= nlmsgHdr; {
			l := int(binary.NativeEndian.Uint32(b))
			if l < nlmsgHdr || l > len(b) {
				return nil, errs, errors.New("netlink: truncated message")
			}
			m := b[:l]
			b = b[min(len(b), (l+3)&^3):]
			mtyp := binary.NativeEndian.Uint16(m[4:])
			mflags := binary.NativeEndian.Uint16(m[6:])
			mseq := binary.NativeEndian.Uint32(m[8:])
			switch mtyp {
			case unix.NLMSG_ERROR:
				e := parseErr(m[nlmsgHdr:], mflags)
				e.seq = mseq
				if mseq != seq {
					if e.errno != 0 {
						errs = append(errs, e)
					}
					continue
				}
				if e.errno != 0 {
					return nil, errs, &e
				}
				return replies, errs, nil // the ack ends a request
			case unix.NLMSG_DONE:
				if mseq == seq {
					// A dump ends here: the kernel acks no dump.
					if mflags&unix.NLM_F_DUMP_INTR != 0 {
						return nil, errs, errDumpInterrupted
					}
					return replies, errs, nil
				}
				continue
			}
			if mseq == seq && len(m) >= nlmsgHdr+4 {
				replies = append(replies, reply{typ: mtyp & 0xff, flags: mflags, seq: mseq, data: append([]byte(nil), m[nlmsgHdr+4:]...)})
			}
		}
	}
}

var errDumpInterrupted = errors.New("netlink dump interrupted")

// Unwrap lets errors.Is(err, syscall.ENOENT) see the errno, so
// nft.IsNotFound and nft.IsExists classify a refusal however it is wrapped.
func (e *opError) Unwrap() error { return e.errno }

func (e *opError) Error() string {
	if e.msg != "" {
		return fmt.Sprintf("%v (%s)", e.errno, e.msg)
	}
	return e.errno.Error()
}

// parseErr reads an nlmsgerr (errno, the original header, extack attributes).
func parseErr(b []byte, flags uint16) opError {
	if len(b) < 4 {
		return opError{errno: unix.EIO}
	}
	e := opError{errno: syscall.Errno(-int32(binary.NativeEndian.Uint32(b)))}
	if flags&unix.NLM_F_ACK_TLVS == 0 || len(b) < 4+nlmsgHdr {
		return e
	}
	off := 4 + nlmsgHdr
	if flags&unix.NLM_F_CAPPED == 0 {
		off = 4 + int(binary.NativeEndian.Uint32(b[4:]))
	}
	if off > len(b) {
		return e
	}
	if ad, err := netlink.NewAttributeDecoder(b[off:]); err == nil {
		for ad.Next() {
			if ad.Type() == unix.NLMSGERR_ATTR_MSG {
				e.msg = ad.String()
			}
		}
	}
	return e
}
