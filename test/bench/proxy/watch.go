package main

// watch: the kernel's nftables notifications, read straight off netlink.
//
// Every nftables commit (and iptables-nft's restores are nftables commits)
// is announced to the NFNLGRP_NFTABLES multicast group, one message per
// object, when the transaction is committed. `nft monitor` formats each
// one as text, which at 10,000 Services (a kube-proxy iptables sync
// rewrites a 10,000-rule chain) lags the kernel by up to seconds and can
// overrun its socket. This reads the raw messages instead: for each new
// rule or set element it looks for IPv4 addresses of the given prefixes
// among the message's 4-byte-aligned words (netlink attributes are 4-byte
// aligned, and nftables' registers hold an address in a word of its own:
// a comparison's data, a DNAT's immediate, a map key or value) and prints
// "<unix nanoseconds> <address> <set or chain>" for each, stamped when the
// message was read. The harness knows which addresses it waits for: a ClusterIP in a
// rule or element (the Service programmed), a new endpoint address
// (programmed with it); addresses are never reused, so a match is the
// transaction that installed it.

import (
	"bufio"
	"encoding/binary"
	"errors"
	"flag"
	"fmt"
	"net/netip"
	"os"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

const (
	nfnlSubsysNFTables = 10 // NFNL_SUBSYS_NFTABLES
	nftMsgNewRule      = 6  // NFT_MSG_NEWRULE
	nftMsgNewSetElem   = 12 // NFT_MSG_NEWSETELEM
	nfnlGroupNFTables  = 7  // NFNLGRP_NFTABLES
)

// watchCmd prints "ready" once subscribed, then one line per address found
// ("lost" when the kernel dropped messages for want of buffer).
func watchCmd(args []string) error {
	fs := flag.NewFlagSet("watch", flag.ExitOnError)
	prefixes := fs.String("prefixes", "", "comma-separated IPv4 prefixes to report")
	_ = fs.Parse(args)
	var pfx []netip.Prefix
	for _, s := range strings.Split(*prefixes, ",") {
		p, err := netip.ParsePrefix(strings.TrimSpace(s))
		if err != nil || !p.Addr().Is4() {
			return fmt.Errorf("-prefixes: %q: want IPv4 prefixes", s)
		}
		pfx = append(pfx, p.Masked())
	}
	fd, err := unix.Socket(unix.AF_NETLINK, unix.SOCK_RAW|unix.SOCK_CLOEXEC, unix.NETLINK_NETFILTER)
	if err != nil {
		return fmt.Errorf("netlink socket: %w", err)
	}
	// Room for a 100,000-object commit (root: SO_RCVBUFFORCE).
	if err := unix.SetsockoptInt(fd, unix.SOL_SOCKET, unix.SO_RCVBUFFORCE, 256<<20); err != nil {
		return fmt.Errorf("netlink receive buffer: %w", err)
	}
	if err := unix.Bind(fd, &unix.SockaddrNetlink{Family: unix.AF_NETLINK, Groups: 1 << (nfnlGroupNFTables - 1)}); err != nil {
		return fmt.Errorf("netlink bind: %w", err)
	}
	out := bufio.NewWriterSize(os.Stdout, 1<<16)
	fmt.Fprintln(out, "ready")
	if err := out.Flush(); err != nil {
		return err
	}
	buf := make([]byte, 1<<20)
	for {
		n, _, err := unix.Recvfrom(fd, buf, 0)
		now := time.Now().UnixNano()
		if errors.Is(err, unix.ENOBUFS) {
			fmt.Fprintln(out, "lost")
			_ = out.Flush()
			continue
		}
		if errors.Is(err, unix.EINTR) {
			continue
		}
		if err != nil {
			return fmt.Errorf("netlink receive: %w", err)
		}
		msgs, err := syscall.ParseNetlinkMessage(buf[:n])
		if err != nil {
			continue
		}
		for _, m := range msgs {
			if m.Header.Type>>8 != nfnlSubsysNFTables {
				continue
			}
			if t := m.Header.Type & 0xff; t != nftMsgNewRule && t != nftMsgNewSetElem {
				continue
			}
			where := objectName(m.Data)
			for _, a := range scanAddrs(m.Data, pfx) {
				fmt.Fprintf(out, "%d %s %s\n", now, a, where)
			}
		}
		if err := out.Flush(); err != nil {
			return err
		}
	}
}

// objectName is the set (NFTA_SET_ELEM_LIST_SET) or chain
// (NFTA_RULE_CHAIN) a new element or rule message is for: both are
// top-level attribute 2, a string; "-" when absent.
func objectName(data []byte) string {
	for i := 4; i+4 <= len(data); { // after nfgenmsg
		l := int(binary.LittleEndian.Uint16(data[i:]))
		t := binary.LittleEndian.Uint16(data[i+2:]) & 0x3fff
		if l < 4 || i+l > len(data) {
			break
		}
		if t == 2 {
			if v := strings.TrimRight(string(data[i+4:i+l]), "\x00"); v != "" && !strings.ContainsAny(v, " \n") {
				return v
			}
		}
		i += (l + 3) &^ 3
	}
	return "-"
}

// scanAddrs returns the distinct addresses within prefixes found at
// 4-byte-aligned offsets of data.
func scanAddrs(data []byte, prefixes []netip.Prefix) []netip.Addr {
	var found []netip.Addr
	for i := 0; i+4 <= len(data); i += 4 {
		w := binary.BigEndian.Uint32(data[i:])
		a := netip.AddrFrom4([4]byte{byte(w >> 24), byte(w >> 16), byte(w >> 8), byte(w)})
		for _, p := range prefixes {
			if p.Contains(a) {
				dup := false
				for _, f := range found {
					dup = dup || f == a
				}
				if !dup {
					found = append(found, a)
				}
				break
			}
		}
	}
	return found
}
