package netexec

// The DF probe: one UDP datagram of an exact IPv4 packet size with Don't
// Fragment set, sent to a netexec UDP server ("echo <padding>"), and what
// became of it: answered, refused by a router on the way with ICMP
// "fragmentation needed" (read from the socket's error queue, so the
// router's address and the MTU it names are reported), or refused by this
// host's own interface before it left.
//
// The socket uses IP_PMTUDISC_PROBE: DF is set and the kernel's cached path
// MTU is ignored, so a second probe after an ICMP is sent again instead of
// being refused locally from the cache; only the outgoing interface's own
// MTU limits it. IP_RECVERR queues ICMP errors on the socket. IPv4 only.

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/sys/unix"
)

// Probe results.
const (
	ProbeDelivered   = "delivered"     // the server echoed the whole payload
	ProbeFragNeeded  = "frag-needed"   // ICMP type 3 code 4 from a router on the path
	ProbeICMP        = "icmp"          // another ICMP error (port unreachable, ...)
	ProbeLocalTooBig = "local-too-big" // this host's interface MTU is smaller (EMSGSIZE at send)
	ProbeNoAnswer    = "no-answer"     // nothing came back in time
)

// udpIPv4Overhead is the IPv4 header (no options) plus the UDP header.
const udpIPv4Overhead = 20 + 8

// ProbeResult is what one DF probe found.
type ProbeResult struct {
	Size     int    `json:"size"` // IPv4 packet size sent
	Result   string `json:"result"`
	MTU      int    `json:"mtu,omitempty"`  // frag-needed: the MTU the router named; local-too-big: the outgoing interface's
	From     string `json:"from,omitempty"` // who answered or sent the ICMP error
	ICMPType int    `json:"icmpType,omitempty"`
	ICMPCode int    `json:"icmpCode,omitempty"`
	Tries    int    `json:"tries"`
}

// ProbeDF sends one UDP datagram making an IPv4 packet of size bytes, DF
// set, to the netexec UDP server at to, up to tries times (a try ends
// after timeout without an answer or error), and reports the outcome.
// An error means the probe could not be made (bad address, no socket).
func ProbeDF(ctx context.Context, to netip.AddrPort, size, tries int, timeout time.Duration) (ProbeResult, error) {
	res := ProbeResult{Size: size}
	const cmd = "echo "
	if !to.Addr().Is4() {
		return res, fmt.Errorf("df probe: %s is not an IPv4 address", to.Addr())
	}
	if size < udpIPv4Overhead+len(cmd)+1 || size > 65535 {
		return res, fmt.Errorf("df probe: size %d: want %d to 65535 (IPv4 packet bytes)", size, udpIPv4Overhead+len(cmd)+1)
	}
	if tries < 1 {
		tries = 1
	}
	payload := []byte(cmd + strings.Repeat("x", size-udpIPv4Overhead-len(cmd)))
	want := len(payload) - len(cmd)

	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return res, fmt.Errorf("df probe: socket: %w", err)
	}
	defer unix.Close(fd)
	if err := unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_MTU_DISCOVER, unix.IP_PMTUDISC_PROBE); err != nil {
		return res, fmt.Errorf("df probe: IP_MTU_DISCOVER: %w", err)
	}
	if err := unix.SetsockoptInt(fd, unix.IPPROTO_IP, unix.IP_RECVERR, 1); err != nil {
		return res, fmt.Errorf("df probe: IP_RECVERR: %w", err)
	}
	if err := unix.Connect(fd, &unix.SockaddrInet4{Port: int(to.Port()), Addr: to.Addr().As4()}); err != nil {
		return res, fmt.Errorf("df probe: connect %s: %w", to, err)
	}

	buf := make([]byte, 65536)
	for res.Tries < tries {
		res.Tries++
		if err := unix.Send(fd, payload, 0); err != nil {
			if errors.Is(err, unix.EMSGSIZE) {
				res.Result = ProbeLocalTooBig
				res.MTU = localMTU(fd)
				return res, nil
			}
			// An ICMP error from an earlier try is reported at the next
			// send; the error queue still holds it.
			if !errors.Is(err, unix.ECONNREFUSED) && !errors.Is(err, unix.EHOSTUNREACH) {
				return res, fmt.Errorf("df probe: send to %s: %w", to, err)
			}
		}
		deadline := time.Now().Add(timeout)
		for {
			if err := ctx.Err(); err != nil {
				return res, err
			}
			wait := time.Until(deadline)
			if wait <= 0 {
				break
			}
			pfd := []unix.PollFd{{Fd: int32(fd), Events: unix.POLLIN}}
			n, err := unix.Poll(pfd, int(min(wait, 100*time.Millisecond)/time.Millisecond)+1)
			if errors.Is(err, unix.EINTR) {
				continue
			}
			if err != nil {
				return res, fmt.Errorf("df probe: poll: %w", err)
			}
			if n == 0 {
				continue
			}
			if pfd[0].Revents&unix.POLLERR != 0 {
				if ok, err := readErrQueue(fd, &res); err != nil || ok {
					return res, err
				}
				continue
			}
			if pfd[0].Revents&unix.POLLIN != 0 {
				m, err := unix.Read(fd, buf)
				if err != nil {
					if errors.Is(err, unix.EAGAIN) || errors.Is(err, unix.EINTR) {
						continue
					}
					// ECONNREFUSED and the like: the error queue says more.
					if ok, qerr := readErrQueue(fd, &res); qerr != nil || ok {
						return res, qerr
					}
					continue
				}
				if m == want {
					res.Result = ProbeDelivered
					res.From = to.String()
					return res, nil
				}
				// Not our echo (a stray datagram): keep waiting.
			}
		}
	}
	res.Result = ProbeNoAnswer
	return res, nil
}

// readErrQueue reads one ICMP error from fd's error queue into res. ok is
// false when the queue held nothing usable.
func readErrQueue(fd int, res *ProbeResult) (ok bool, err error) {
	data := make([]byte, 512)
	oob := make([]byte, 512)
	_, oobn, _, _, err := unix.Recvmsg(fd, data, oob, unix.MSG_ERRQUEUE|unix.MSG_DONTWAIT)
	if errors.Is(err, unix.EAGAIN) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("df probe: reading the error queue: %w", err)
	}
	msgs, err := unix.ParseSocketControlMessage(oob[:oobn])
	if err != nil {
		return false, fmt.Errorf("df probe: error queue: %w", err)
	}
	for _, m := range msgs {
		if m.Header.Level != unix.SOL_IP || m.Header.Type != unix.IP_RECVERR {
			continue
		}
		ee, from, ok := parseExtendedErr(m.Data)
		if !ok || ee.Origin != unix.SO_EE_ORIGIN_ICMP {
			continue
		}
		res.ICMPType, res.ICMPCode = int(ee.Type), int(ee.Code)
		if from.IsValid() {
			res.From = from.String()
		}
		res.Result = ProbeICMP
		if ee.Type == 3 && ee.Code == 4 { // destination unreachable, fragmentation needed
			res.Result = ProbeFragNeeded
			res.MTU = int(ee.Info)
		}
		return true, nil
	}
	return false, nil
}

// localMTU is the MTU of the interface holding fd's local address (the
// one a PMTUDISC_PROBE send is limited by); 0 when not found.
func localMTU(fd int) int {
	sa, err := unix.Getsockname(fd)
	if err != nil {
		return 0
	}
	in4, ok := sa.(*unix.SockaddrInet4)
	if !ok {
		return 0
	}
	local := netip.AddrFrom4(in4.Addr)
	ifs, err := net.Interfaces()
	if err != nil {
		return 0
	}
	for _, ifc := range ifs {
		addrs, _ := ifc.Addrs()
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok {
				if ip, ok := netip.AddrFromSlice(n.IP); ok && ip.Unmap() == local {
					return ifc.MTU
				}
			}
		}
	}
	return 0
}

// parseExtendedErr decodes struct sock_extended_err and the offender's
// sockaddr_in that follows it (SO_EE_OFFENDER).
func parseExtendedErr(b []byte) (unix.SockExtendedErr, netip.Addr, bool) {
	const eeLen = 16 // u32 errno; u8 origin, type, code, pad; u32 info, data
	if len(b) < eeLen {
		return unix.SockExtendedErr{}, netip.Addr{}, false
	}
	ee := unix.SockExtendedErr{
		Errno:  binary.NativeEndian.Uint32(b[0:4]),
		Origin: b[4], Type: b[5], Code: b[6], Pad: b[7],
		Info: binary.NativeEndian.Uint32(b[8:12]),
		Data: binary.NativeEndian.Uint32(b[12:16]),
	}
	var from netip.Addr
	// sockaddr_in: u16 family, u16 port, 4 address bytes.
	if off := b[eeLen:]; len(off) >= 8 && binary.NativeEndian.Uint16(off[0:2]) == unix.AF_INET {
		from = netip.AddrFrom4([4]byte(off[4:8]))
	}
	return ee, from, true
}

// newDFProbeCommand returns `flatnet netexec df-probe`.
func newDFProbeCommand() *cobra.Command {
	var to string
	var size, tries int
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "df-probe --to IP:PORT --size BYTES",
		Short: "Send one UDP packet of an exact size with Don't Fragment set to a netexec UDP server and report what happened (JSON)",
		Long: "df-probe sends a UDP datagram making an IPv4 packet of --size bytes (20 IP + 8 UDP +\n" +
			"payload) with DF set to the netexec UDP server at --to, which echoes it. It prints one\n" +
			"JSON line: result \"delivered\", \"frag-needed\" (a router on the way answered ICMP\n" +
			"type 3 code 4; mtu and from say which MTU and which router), \"icmp\" (another ICMP\n" +
			"error), \"local-too-big\" (this host's interface refused it; mtu is that interface's) or\n" +
			"\"no-answer\". The exit code is 0 only when delivered. The kernel's cached path MTU is\n" +
			"ignored (IP_PMTUDISC_PROBE), so every probe really leaves this host.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ap, err := netip.ParseAddrPort(to)
			if err != nil {
				return fmt.Errorf("--to %q: want IPv4:PORT: %w", to, err)
			}
			res, err := ProbeDF(cmd.Context(), ap, size, tries, timeout)
			if err != nil {
				return err
			}
			b, _ := json.Marshal(res)
			fmt.Fprintln(cmd.OutOrStdout(), string(b))
			if res.Result != ProbeDelivered {
				os.Exit(1)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.StringVar(&to, "to", "", "the netexec UDP server, IPv4:PORT (netexec's --udp-port, 8081 by default)")
	f.IntVar(&size, "size", 1500, "IPv4 packet size in bytes, headers included")
	f.IntVar(&tries, "tries", 3, "how many times to send when nothing comes back")
	f.DurationVar(&timeout, "timeout", time.Second, "how long each try waits")
	_ = cmd.MarkFlagRequired("to")
	return cmd
}
