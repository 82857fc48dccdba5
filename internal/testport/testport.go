// Package testport finds a free TCP port on the loopback address for a
// test to bind later, outside the kernel's range of ephemeral ports: a
// port taken from that range (by listening on port 0) can be handed to
// another process's outgoing connection between the moment the test
// closes it and the moment it binds it again, which made tests fail with
// "address already in use" when packages ran side by side.
package testport

import (
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"testing"
)

// ephemeral returns the kernel's range of ephemeral ports (Linux's
// ip_local_port_range; elsewhere, or unreadable, the IANA range).
func ephemeral() (lo, hi int) {
	lo, hi = 49152, 65535
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return lo, hi
	}
	f := strings.Fields(string(b))
	if len(f) != 2 {
		return lo, hi
	}
	l, err1 := strconv.Atoi(f[0])
	h, err2 := strconv.Atoi(f[1])
	if err1 != nil || err2 != nil || l > h {
		return lo, hi
	}
	return l, h
}

// Addr returns 127.0.0.1:PORT, PORT free when it was tried and outside
// the ephemeral range (from 10000 up to it, or above it), else, after
// 100 tries, one the kernel gives.
func Addr(t testing.TB) string {
	t.Helper()
	lo, hi := ephemeral()
	var ranges [][2]int
	if lo > 10000 {
		ranges = append(ranges, [2]int{10000, lo - 1})
	}
	if hi < 65535 {
		ranges = append(ranges, [2]int{hi + 1, 65535})
	}
	for range 100 {
		if len(ranges) == 0 {
			break
		}
		r := ranges[rand.IntN(len(ranges))]
		addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(r[0]+rand.IntN(r[1]-r[0]+1)))
		if l, err := net.Listen("tcp", addr); err == nil {
			l.Close()
			return addr
		}
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("testport: %v", err)
	}
	defer l.Close()
	return l.Addr().String()
}

// Port is Addr's port.
func Port(t testing.TB) int {
	t.Helper()
	_, p, _ := net.SplitHostPort(Addr(t))
	n, _ := strconv.Atoi(p)
	return n
}
