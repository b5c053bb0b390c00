package lbipam

import (
	"errors"
	"net/netip"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
)

func mustPool(t *testing.T, s string) Pool {
	t.Helper()
	p, err := ParsePool(s)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

func TestAllocatorLowestFree(t *testing.T) {
	a := NewAllocator(mustPool(t, "10.0.0.4-10.0.0.5, 10.0.1.0/31, fd00::8/127"))
	var got []string
	for range 4 {
		x, err := a.Allocate(corev1.IPv4Protocol)
		if err != nil {
			t.Fatal(err)
		}
		got = append(got, x.String())
	}
	if strings.Join(got, " ") != "10.0.0.4 10.0.0.5 10.0.1.0 10.0.1.1" {
		t.Errorf("allocated %v", got)
	}
	_, err := a.Allocate(corev1.IPv4Protocol)
	if !errors.Is(err, ErrExhausted) || !strings.Contains(err.Error(), "all 4 IPv4 addresses of the pool 10.0.0.4/31,10.0.1.0/31,fd00::8/127 are in use") {
		t.Errorf("exhausted: %v", err)
	}
	a.Release(netip.MustParseAddr("10.0.0.5"))
	if x, err := a.Allocate(corev1.IPv4Protocol); err != nil || x.String() != "10.0.0.5" {
		t.Errorf("after release: %v %v, want 10.0.0.5", x, err)
	}
	if x, err := a.Allocate(corev1.IPv6Protocol); err != nil || x.String() != "fd00::8" {
		t.Errorf("IPv6: %v %v", x, err)
	}
	if a.Used(corev1.IPv4Protocol) != 4 || a.Used(corev1.IPv6Protocol) != 1 {
		t.Errorf("used %d, %d", a.Used(corev1.IPv4Protocol), a.Used(corev1.IPv6Protocol))
	}
}

func TestAllocatorNoFamily(t *testing.T) {
	a := NewAllocator(mustPool(t, "10.0.0.0/30"))
	if _, err := a.Allocate(corev1.IPv6Protocol); !errors.Is(err, ErrExhausted) || !strings.Contains(err.Error(), "has no IPv6 addresses") {
		t.Errorf("IPv6 from an IPv4 pool: %v", err)
	}
}

func TestAllocatorOccupyAndShrink(t *testing.T) {
	a := NewAllocator(mustPool(t, "10.0.0.0/30"))
	in, err := a.Occupy(netip.MustParseAddr("10.0.0.0"))
	if !in || err != nil {
		t.Errorf("occupy in pool: %v %v", in, err)
	}
	if _, err := a.Occupy(netip.MustParseAddr("10.0.0.0")); !errors.Is(err, ErrInUse) {
		t.Errorf("second occupy: %v", err)
	}
	out := netip.MustParseAddr("10.9.9.9")
	if in, err := a.Occupy(out); in || err != nil {
		t.Errorf("occupy outside: %v %v", in, err)
	}
	// Shrink to exclude 10.0.0.0, then grow back over 10.9.9.9: both stay
	// in use throughout.
	a.SetPool(mustPool(t, "10.0.0.1-10.0.0.2"))
	if !a.InUse(netip.MustParseAddr("10.0.0.0")) || a.Used(corev1.IPv4Protocol) != 0 {
		t.Errorf("shrunk: in use %v, used %d", a.InUse(netip.MustParseAddr("10.0.0.0")), a.Used(corev1.IPv4Protocol))
	}
	a.SetPool(mustPool(t, "10.9.9.8/30"))
	if x, err := a.Allocate(corev1.IPv4Protocol); err != nil || x.String() != "10.9.9.8" {
		t.Errorf("grown: %v %v", x, err)
	}
	if x, err := a.Allocate(corev1.IPv4Protocol); err != nil || x.String() != "10.9.9.10" {
		t.Errorf("grown, 10.9.9.9 in use: %v %v", x, err)
	}
}

func TestAllocatorLargeIPv6(t *testing.T) {
	a := NewAllocator(mustPool(t, "fd00::/64"))
	for i := range 3 {
		x, err := a.Allocate(corev1.IPv6Protocol)
		if err != nil || x != netip.AddrFrom16([16]byte{0: 0xfd, 15: byte(i)}) {
			t.Fatalf("allocation %d: %v %v", i, x, err)
		}
	}
}
