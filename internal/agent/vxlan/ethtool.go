package vxlan

import (
	"fmt"
	"runtime"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Transmit checksum offload through the legacy ethtool ioctl (what
// `ethtool -K <dev> tx on|off` does): ETHTOOL_STXCSUM toggles every
// tx-checksum feature of the device at once. The socket is opened on the
// calling thread, so the ioctl reaches that thread's network namespace.

// ethtoolValue is struct ethtool_value.
type ethtoolValue struct {
	cmd  uint32
	data uint32
}

// ifreqData is struct ifreq with ifr_data.
type ifreqData struct {
	name [unix.IFNAMSIZ]byte
	data unsafe.Pointer
	_    [16]byte // the rest of the union
}

func ethtool(dev string, v *ethtoolValue) error {
	if len(dev) >= unix.IFNAMSIZ {
		return fmt.Errorf("device name %q too long", dev)
	}
	fd, err := unix.Socket(unix.AF_INET, unix.SOCK_DGRAM|unix.SOCK_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("ethtool socket: %w", err)
	}
	defer unix.Close(fd)
	var ifr ifreqData
	copy(ifr.name[:], dev)
	ifr.data = unsafe.Pointer(v)
	_, _, errno := unix.Syscall(unix.SYS_IOCTL, uintptr(fd), unix.SIOCETHTOOL, uintptr(unsafe.Pointer(&ifr)))
	runtime.KeepAlive(v)
	if errno != 0 {
		return errno
	}
	return nil
}

func txChecksum(dev string) (bool, error) {
	v := &ethtoolValue{cmd: unix.ETHTOOL_GTXCSUM}
	if err := ethtool(dev, v); err != nil {
		return false, fmt.Errorf("reading tx checksum offload of %s: %w", dev, err)
	}
	return v.data != 0, nil
}

func setTxChecksum(dev string, on bool) error {
	v := &ethtoolValue{cmd: unix.ETHTOOL_STXCSUM}
	if on {
		v.data = 1
	}
	if err := ethtool(dev, v); err != nil {
		return fmt.Errorf("setting tx checksum offload of %s to %v: %w", dev, on, err)
	}
	return nil
}
