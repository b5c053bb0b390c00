package store

import (
	"errors"
	"fmt"
	"io/fs"
	"net/netip"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"
)

// DefaultDataDir is where reservations live when ipam.dataDir is not set,
// the same default as the reference plugin.
const DefaultDataDir = "/var/lib/cni/networks"

const (
	lastIPFilePrefix = "last_reserved_ip."
	// lockFileName is the file inside the network directory that every
	// host-local (ours and the reference's go-filemutex) flocks.
	lockFileName = "lock"
)

// Disk is the on-disk store of one network: DATADIR/NETWORK/ holds one
// file per reserved address (named by the address, holding
// "containerID\r\nifname"), last_reserved_ip.N per range set, and the lock
// file. This is the layout of the reference plugin, so either plugin can
// take over a node's state from the other.
type Disk struct {
	dir    string
	lockFD int // DIR/lock, opened like go-filemutex does
}

var _ Store = (*Disk)(nil)

// Dir returns DATADIR/NETWORK for a network, with the default dataDir when
// dataDir is empty.
func Dir(network, dataDir string) string {
	if dataDir == "" {
		dataDir = DefaultDataDir
	}
	return filepath.Join(dataDir, network)
}

// Open creates (if needed) and opens the store of network under dataDir.
// Close it when done.
func Open(network, dataDir string) (*Disk, error) {
	dir := Dir(network, dataDir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, fmt.Errorf("creating host-local data directory: %w", err)
	}
	// Same open mode as go-filemutex (used by the reference), so neither
	// plugin fails to open a lock file the other created.
	name := filepath.Join(dir, lockFileName)
	fd, err := unix.Open(name, unix.O_RDONLY|unix.O_CREAT|unix.O_CLOEXEC, 0o750)
	if err != nil {
		return nil, fmt.Errorf("opening host-local lock file: %w", &fs.PathError{Op: "open", Path: name, Err: err})
	}
	return &Disk{dir: dir, lockFD: fd}, nil
}

// Path returns the network's directory.
func (d *Disk) Path() string { return d.dir }

// Lock takes the exclusive flock on DIR/lock, waiting for it. flock locks
// belong to the open file, so two Disk values in one process exclude each
// other just as two processes do.
func (d *Disk) Lock() error {
	for {
		err := unix.Flock(d.lockFD, unix.LOCK_EX)
		if err == nil {
			return nil
		}
		if !errors.Is(err, unix.EINTR) {
			return fmt.Errorf("locking %s: %w", filepath.Join(d.dir, lockFileName), err)
		}
	}
}

// Unlock releases the lock.
func (d *Disk) Unlock() error {
	if err := unix.Flock(d.lockFD, unix.LOCK_UN); err != nil {
		return fmt.Errorf("unlocking %s: %w", filepath.Join(d.dir, lockFileName), err)
	}
	return nil
}

// Close releases the lock (if held) and closes the lock file.
func (d *Disk) Close() error {
	if d.lockFD < 0 {
		return nil
	}
	err := unix.Close(d.lockFD) // closing the last fd drops the flock
	d.lockFD = -1
	return err
}

func (d *Disk) ipPath(ip netip.Addr) string { return filepath.Join(d.dir, ip.Unmap().String()) }

// Reserve creates the reservation file exclusively (O_EXCL), so even a
// writer that ignored the lock could not double-issue the address.
func (d *Disk) Reserve(id, ifname string, ip netip.Addr, rangeID string) (bool, error) {
	name := d.ipPath(ip)
	f, err := os.OpenFile(name, os.O_RDWR|os.O_EXCL|os.O_CREATE, 0o600)
	if errors.Is(err, fs.ErrExist) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("reserving %s: %w", ip, err)
	}
	_, werr := f.WriteString(Key(id, ifname))
	cerr := f.Close()
	if werr != nil || cerr != nil {
		os.Remove(name)
		return false, fmt.Errorf("writing reservation %s: %w", name, errors.Join(werr, cerr))
	}
	last := filepath.Join(d.dir, lastIPFilePrefix+rangeID)
	if err := os.WriteFile(last, []byte(ip.Unmap().String()), 0o600); err != nil {
		os.Remove(name)
		return false, fmt.Errorf("writing %s: %w", last, err)
	}
	return true, nil
}

// LastReservedIP reads last_reserved_ip.rangeID.
func (d *Disk) LastReservedIP(rangeID string) (netip.Addr, bool) {
	data, err := os.ReadFile(filepath.Join(d.dir, lastIPFilePrefix+rangeID))
	if err != nil {
		return netip.Addr{}, false
	}
	ip, err := netip.ParseAddr(strings.TrimSpace(string(data)))
	if err != nil {
		return netip.Addr{}, false
	}
	return ip.Unmap(), true
}

// reservationFiles lists DIR's reservation files: regular files named by
// an IP address. Everything else (lock, last_reserved_ip.N, files a human
// left there) is not a reservation.
func (d *Disk) reservationFiles() ([]netip.Addr, error) {
	entries, err := os.ReadDir(d.dir)
	if err != nil {
		return nil, fmt.Errorf("listing reservations: %w", err)
	}
	var out []netip.Addr
	for _, e := range entries {
		if !e.Type().IsRegular() {
			continue
		}
		ip, err := netip.ParseAddr(e.Name())
		if err != nil || ip.Zone() != "" || ip.Is4In6() || ip.String() != e.Name() {
			continue // not a name either plugin writes
		}
		out = append(out, ip)
	}
	return out, nil
}

// List reads every reservation. Files that vanish while we read them
// (another writer ignoring the lock) are skipped.
func (d *Disk) List() ([]Reservation, error) {
	ips, err := d.reservationFiles()
	if err != nil {
		return nil, err
	}
	// Reading every reservation is the cost of every ADD and DEL (as in
	// the reference), so read them with openat on the directory and one
	// read each instead of os.ReadFile's open/fstat/read/read/close and
	// poller registration.
	dirfd, err := unix.Open(d.dir, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("listing reservations: %w", &fs.PathError{Op: "open", Path: d.dir, Err: err})
	}
	defer unix.Close(dirfd)
	out := make([]Reservation, 0, len(ips))
	var buf [512]byte
	for _, ip := range ips {
		data, err := readSmall(dirfd, ip.String(), buf[:])
		if err != nil {
			continue
		}
		id, ifname, legacy := ParseKey(string(data))
		out = append(out, Reservation{IP: ip, ContainerID: id, IfName: ifname, Legacy: legacy})
	}
	return out, nil
}

// readSmall reads the file name (relative to dirfd), using buf when it is
// big enough.
func readSmall(dirfd int, name string, buf []byte) ([]byte, error) {
	var fd int
	var err error
	for {
		fd, err = unix.Openat(dirfd, name, unix.O_RDONLY|unix.O_CLOEXEC, 0)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	data := buf[:0]
	for {
		if len(data) == cap(data) {
			data = append(data, 0)[:len(data)]
		}
		n, err := unix.Read(fd, data[len(data):cap(data)])
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, err
		}
		if n == 0 {
			return data, nil
		}
		data = data[:len(data)+n]
	}
}

// GetByID returns the addresses held by (id, ifname), legacy ones included
// (as the reference does).
func (d *Disk) GetByID(id, ifname string) ([]netip.Addr, error) {
	all, err := d.List()
	if err != nil {
		return nil, err
	}
	return byID(all, id, ifname, true), nil
}

// ReleaseByID frees (id, ifname)'s reservations, or id's legacy ones when
// it has none, like the reference.
func (d *Disk) ReleaseByID(id, ifname string) error {
	all, err := d.List()
	if err != nil {
		return err
	}
	ips := byID(all, id, ifname, false)
	if len(ips) == 0 {
		ips = legacyByID(all, id)
	}
	var errs []error
	for _, ip := range ips {
		errs = append(errs, d.Release(ip))
	}
	return errors.Join(errs...)
}

// Release removes ip's reservation file; a missing file is not an error.
func (d *Disk) Release(ip netip.Addr) error {
	if err := os.Remove(d.ipPath(ip)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("releasing %s: %w", ip, err)
	}
	return nil
}

func byID(all []Reservation, id, ifname string, withLegacy bool) []netip.Addr {
	id = strings.TrimSpace(id)
	var out []netip.Addr
	for _, r := range all {
		if (!r.Legacy && r.ContainerID == id && r.IfName == ifname) || (withLegacy && r.Legacy && r.ContainerID == id) {
			out = append(out, r.IP)
		}
	}
	return out
}

func legacyByID(all []Reservation, id string) []netip.Addr {
	id = strings.TrimSpace(id)
	var out []netip.Addr
	for _, r := range all {
		if r.Legacy && r.ContainerID == id {
			out = append(out, r.IP)
		}
	}
	return out
}
