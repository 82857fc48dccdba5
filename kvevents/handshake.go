package kvevents

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"slices"
	"time"
)

// The ZMQ library performs each accepted connection's handshake inside
// its accept loop, one connection at a time: a publisher slow to greet
// held every later one back for the handshake deadline (issue 29, N2). A
// bound endpoint's listener therefore performs the handshake's first half
// itself, on a goroutine of each connection: it sends the greeting the
// library would send and reads the peer's greeting and READY, within the
// handshake deadline, then checks them. Only then does it hand the
// connection to the library, which replays them: its greeting write is
// swallowed (it was sent ahead) and its reads are served from what was
// read ahead, so that its handshake completes without waiting on the
// peer.

// libGreeting is the greeting the library sends (ZMTP 3.0, the NULL
// mechanism, as-server 0): sent ahead of it, then swallowed from its
// writes.
var libGreeting = func() (g [64]byte) {
	g[0], g[9], g[10], g[11] = 0xff, 0x7f, 3, 0
	copy(g[12:32], "NULL")
	return g
}()

// maxHandshakeBytes bounds what a peer may send before its handshake is
// done (its greeting and READY): a READY holds a few short properties.
const maxHandshakeBytes = 16 << 10

// readHandshake sends the library's greeting on c, reads the peer's
// greeting and READY (and whatever follows them in the same reads) through
// the guard, and checks them (checkHandshake); what was read is kept for
// the library. The handshake deadline set when c was made bounds it.
func (c *guardConn) readHandshake() error {
	if c.g.handshake > 0 {
		_ = c.Conn.SetWriteDeadline(time.Now().Add(c.g.handshake))
	}
	if _, err := c.Conn.Write(libGreeting[:]); err != nil {
		return err
	}
	_ = c.Conn.SetWriteDeadline(time.Time{})
	c.swallow = len(libGreeting)
	buf := make([]byte, 0, 512)
	for !c.handshook {
		if len(buf) == min(cap(buf), maxHandshakeBytes) {
			if len(buf) >= maxHandshakeBytes {
				c.g.st.badHandshakes.Add(1)
				return fmt.Errorf("%w: over %d bytes without completing the handshake", errGuard, maxHandshakeBytes)
			}
			buf = slices.Grow(buf, len(buf))
		}
		n, err := c.Read(buf[len(buf):min(cap(buf), maxHandshakeBytes)])
		buf = buf[:len(buf)+n]
		if err != nil {
			return err
		}
	}
	if err := checkHandshake(buf); err != nil {
		c.g.st.badHandshakes.Add(1)
		return err
	}
	c.pre = buf
	return nil
}

// checkHandshake checks what a publisher sends first (RFC 23/ZMTP): a
// greeting of ZMTP 3.0 or later with the NULL mechanism, then a READY
// command whose Socket-Type is PUB or XPUB. b holds at least the greeting
// and the first frame, a command (the guard stops reading there); it may
// hold more.
func checkHandshake(b []byte) error {
	if len(b) < 64 {
		return fmt.Errorf("%w: a greeting of %d bytes", errGuard, len(b))
	}
	g := b[:64]
	switch {
	case g[0] != 0xff || g[9] != 0x7f:
		return fmt.Errorf("%w: not a ZMTP greeting", errGuard)
	case g[10] < 3:
		return fmt.Errorf("%w: ZMTP version %d.%d, want 3.0 or later", errGuard, g[10], g[11])
	case !bytes.Equal(bytes.TrimRight(g[12:32], "\x00"), []byte("NULL")):
		return fmt.Errorf("%w: security mechanism %q, want NULL", errGuard, bytes.TrimRight(g[12:32], "\x00"))
	}
	body, err := firstCommand(b[64:])
	if err != nil {
		return err
	}
	if len(body) < 1 || int(body[0]) > len(body)-1 || string(body[1:1+body[0]]) != "READY" {
		return fmt.Errorf("%w: the first command is not READY", errGuard)
	}
	props := body[1+body[0]:]
	for len(props) > 0 {
		k := int(props[0])
		if 1+k+4 > len(props) {
			return fmt.Errorf("%w: a READY property cut short", errGuard)
		}
		name := props[1 : 1+k]
		v := binary.BigEndian.Uint32(props[1+k:])
		props = props[1+k+4:]
		if uint64(v) > uint64(len(props)) {
			return fmt.Errorf("%w: a READY property value of %d bytes, %d left", errGuard, v, len(props))
		}
		value := props[:v]
		props = props[v:]
		if bytes.EqualFold(name, []byte("Socket-Type")) {
			if s := string(value); s != "PUB" && s != "XPUB" {
				return fmt.Errorf("%w: a %q socket, want PUB or XPUB", errGuard, s)
			}
			return nil
		}
	}
	return fmt.Errorf("%w: READY without a Socket-Type", errGuard)
}

// firstCommand returns the body of the first frame of b, which must be a
// whole command.
func firstCommand(b []byte) ([]byte, error) {
	if len(b) < 2 || b[0]&4 == 0 {
		return nil, fmt.Errorf("%w: no command after the greeting", errGuard)
	}
	size, hdr := uint64(b[1]), 2
	if b[0]&2 != 0 {
		if len(b) < 9 {
			return nil, fmt.Errorf("%w: a command header cut short", errGuard)
		}
		size, hdr = binary.BigEndian.Uint64(b[1:9]), 9
	}
	if size > uint64(len(b)-hdr) {
		return nil, fmt.Errorf("%w: a command of %d bytes, %d read", errGuard, size, len(b)-hdr)
	}
	return b[hdr : hdr+int(size)], nil
}
