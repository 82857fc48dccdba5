package testport

import (
	"net"
	"testing"
)

// TestAddr: the port is outside the ephemeral range and can be bound.
func TestAddr(t *testing.T) {
	lo, hi := ephemeral()
	for range 20 {
		addr := Addr(t)
		p := Port(t)
		if p >= lo && p <= hi {
			t.Fatalf("port %d in the ephemeral range %d-%d", p, lo, hi)
		}
		l, err := net.Listen("tcp", addr)
		if err != nil {
			t.Fatalf("%s: %v", addr, err)
		}
		l.Close()
	}
}
