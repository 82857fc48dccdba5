package kvevents

import (
	"bytes"
	"context"
	"encoding/hex"
	"net"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// dialFrom connects to addr from the loopback address ip.
func dialFrom(t *testing.T, ip, addr string) net.Conn {
	t.Helper()
	d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
	c, err := d.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	return c
}

// TestSubscriberSlowGreetings: the issue-29 finding N2. The library
// performed each handshake in its accept loop, so connections that greet
// slowly from one host held back every later connection, another
// engine's too, for the handshake deadline each (an hour here: the test
// would time out). Now each handshake runs on its own goroutine: another
// engine's publisher is heard while they still hang.
func TestSubscriberSlowGreetings(t *testing.T) {
	idx := newFakeIndex()
	tr := NewTranslator(podResolver(idx, nil), Limits{})
	sub := NewSubscriber(tr, Options{HandshakeTimeout: time.Hour})
	defer sub.Close()
	addr, err := sub.Bind("tcp://127.0.0.1:0")
	require.NoError(t, err)
	guard := func() GuardStats { return sub.Endpoints()[0].Guard }

	for range 3 {
		slow := dialFrom(t, "127.0.0.31", addr.String())
		_, err := slow.Write(libGreeting[:10]) // the signature, then nothing
		require.NoError(t, err)
	}

	pub := dialFrom(t, "127.0.0.32", addr.String())
	greetAsPub(t, pub)
	rawSend(t, pub, frames(topicB, 1, pack(t, arrayBatch(stored{hashes: []uint64{7}, tokens: seqTokens(7, 16), bs: 16}.array()))))
	eventually(t, "the other engine's block", func() bool { return len(idx.keys("10.0.0.2:8000")) == 1 })
	require.Equal(t, uint64(4), guard().Open, "the slow connections still in their handshake")
	require.Zero(t, guard().HandshakeTimeouts)
}

// TestSubscriberBadHandshake: a connection whose handshake is not a ZMTP 3
// PUB's with the NULL mechanism is closed and counted, and its slot
// freed. (The library refused such a connection without closing it: it
// held a slot under MaxConns and MaxConnsPerHost for ever.)
func TestSubscriberBadHandshake(t *testing.T) {
	tr := NewTranslator(podResolver(newFakeIndex(), nil), Limits{})
	sub := NewSubscriber(tr, Options{MaxConnsPerHost: 1})
	defer sub.Close()
	addr, err := sub.Bind("tcp://127.0.0.1:0")
	require.NoError(t, err)
	guard := func() GuardStats { return sub.Endpoints()[0].Guard }

	plain := libGreeting
	copy(plain[12:32], "PLAIN\x00\x00\x00")
	sub2 := readyOf("SUB")
	ping := []byte{0x04, 5, 4, 'P', 'I', 'N', 'G'}
	for i, hs := range [][]byte{
		append(plain[:], readyOf("PUB")...),
		append(libGreeting[:], sub2...),
		append(libGreeting[:], ping...),
	} {
		c := dialFrom(t, "127.0.0.41", addr.String())
		_, err := c.Write(hs)
		require.NoError(t, err)
		closedByPeer(t, c)
		eventually(t, "counted", func() bool { return guard().BadHandshakes == uint64(i+1) })
	}
	eventually(t, "every slot freed", func() bool { return guard().Open == 0 })
	require.Zero(t, guard().HostFull)
	// The host's one slot serves a publisher now.
	good := dialFrom(t, "127.0.0.41", addr.String())
	greetAsPub(t, good)
	eventually(t, "the publisher open", func() bool { return guard().Open == 1 })
}

// readyOf is a READY command naming the socket type.
func readyOf(typ string) []byte {
	body := append([]byte{5}, "READY"...)
	body = append(body, 11)
	body = append(body, "Socket-Type"...)
	body = append(body, 0, 0, 0, byte(len(typ)))
	body = append(body, typ...)
	return append([]byte{0x04, byte(len(body))}, body...)
}

func TestCheckHandshake(t *testing.T) {
	long := append([]byte{0x06, 0, 0, 0, 0, 0, 0, 0, byte(len(readyOf("PUB")) - 2)}, readyOf("PUB")[2:]...)
	twoProps := append([]byte{5}, "READY"...)
	twoProps = append(twoProps, 8)
	twoProps = append(twoProps, "Identity"...)
	twoProps = append(twoProps, 0, 0, 0, 2, 'i', 'd', 11)
	twoProps = append(twoProps, "socket-type"...)
	twoProps = append(twoProps, 0, 0, 0, 4, 'X', 'P', 'U', 'B')
	v31 := libGreeting
	v31[11] = 1
	v2 := libGreeting
	v2[10] = 2
	for _, tc := range []struct {
		name string
		b    []byte
		ok   bool
	}{
		{"PUB", append(libGreeting[:], readyOf("PUB")...), true},
		{"a long frame", append(libGreeting[:], long...), true},
		{"two properties in a long frame", append(libGreeting[:], append([]byte{0x06, 0, 0, 0, 0, 0, 0, 0, byte(len(twoProps))}, twoProps...)...), true},
		{"two properties, any case", append(libGreeting[:], append([]byte{0x04, byte(len(twoProps))}, twoProps...)...), true},
		{"ZMTP 3.1", append(v31[:], readyOf("PUB")...), true},
		{"a message follows", append(append(libGreeting[:], readyOf("PUB")...), 0, 1, 'x'), true},
		{"ZMTP 2", append(v2[:], readyOf("PUB")...), false},
		{"SUB", append(libGreeting[:], readyOf("SUB")...), false},
		{"no Socket-Type", append(libGreeting[:], 0x04, 6, 5, 'R', 'E', 'A', 'D', 'Y'), false},
		{"a property cut short", append(libGreeting[:], 0x04, 9, 5, 'R', 'E', 'A', 'D', 'Y', 11, 'S', 'o'), false},
		{"a value past the end", append(libGreeting[:], 0x04, 11, 5, 'R', 'E', 'A', 'D', 'Y', 1, 'x', 0, 0, 0, 9), false},
		{"not a command", append(libGreeting[:], 0x00, 1, 'x'), false},
		{"short", libGreeting[:40], false},
		{"no signature", append(make([]byte, 64), readyOf("PUB")...), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := checkHandshake(tc.b)
			if tc.ok {
				require.NoError(t, err)
			} else {
				require.ErrorIs(t, err, errGuard)
			}
		})
	}
}

// FuzzCheckHandshake: a peer's first bytes never panic the check; a
// stream it accepts holds a greeting with the NULL mechanism.
func FuzzCheckHandshake(f *testing.F) {
	f.Add(append(libGreeting[:], readyOf("PUB")...))
	f.Add(append(libGreeting[:], readyOf("SUB")...))
	f.Add(append(libGreeting[:], 0x06, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff))
	f.Add(append(libGreeting[:], 0x04, 11, 5, 'R', 'E', 'A', 'D', 'Y', 1, 'x', 0xff, 0xff, 0xff, 0xff))
	f.Fuzz(func(t *testing.T, b []byte) {
		if checkHandshake(b) == nil && !bytes.HasPrefix(b[12:], []byte("NULL")) {
			t.Fatalf("accepted a greeting of mechanism %q", b[12:32])
		}
	})
}

// TestMeasureSlowGreetings measures N2's probe: while 300 connections
// from one address greet one byte at a time, slower than the handshake
// deadline, another address's publisher sends 300 messages; the time until
// all reach the Translator is logged.
//
//	EXA_MEASURE=1 go test ./kvevents -run TestMeasureSlowGreetings -v
func TestMeasureSlowGreetings(t *testing.T) {
	if os.Getenv("EXA_MEASURE") == "" {
		t.Skip("set EXA_MEASURE=1 to measure")
	}
	for _, perHost := range []int{DefaultMaxConnsPerHost, 300} {
		idx := newFakeIndex()
		tr := NewTranslator(podResolver(idx, nil), Limits{})
		sub := NewSubscriber(tr, Options{MaxConnsPerHost: perHost, MaxConns: 400})
		addr, err := sub.Bind("tcp://127.0.0.1:0")
		require.NoError(t, err)
		stop := make(chan struct{})
		var slow []net.Conn
		for range 300 {
			slow = append(slow, dialFrom(t, "127.0.0.31", addr.String()))
		}
		go func() { // one greeting byte per connection every 500 ms
			for i := 0; i < 64; i++ {
				for _, c := range slow {
					_, _ = c.Write(libGreeting[i : i+1])
				}
				select {
				case <-stop:
					return
				case <-time.After(500 * time.Millisecond):
				}
			}
		}()
		time.Sleep(200 * time.Millisecond) // the slow connections queue first
		start := time.Now()
		pub := dialFrom(t, "127.0.0.32", addr.String())
		greetAsPub(t, pub)
		for i := range 300 {
			rawSend(t, pub, frames(topicB, uint64(i+1), pack(t, arrayBatch(stored{hashes: []uint64{uint64(100 + i)}, tokens: seqTokens(uint32(i), 16), bs: 16}.array()))))
		}
		var atOne int
		for deadline := start.Add(40 * time.Second); time.Now().Before(deadline); time.Sleep(5 * time.Millisecond) {
			n := len(idx.keys("10.0.0.2:8000"))
			if time.Since(start) <= time.Second {
				atOne = n
			}
			if n == 300 {
				break
			}
		}
		took := time.Since(start)
		t.Logf("MaxConnsPerHost %d: %d of 300 messages within 1 s, %d in %v; guard %+v",
			perHost, atOne, len(idx.keys("10.0.0.2:8000")), took.Round(time.Millisecond), sub.Endpoints()[0].Guard)
		close(stop)
		sub.Close()
		for _, c := range slow {
			c.Close()
		}
	}
}

// TestLibzmqPublisher: a publisher of libzmq (vLLM's, through pyzmq),
// which sends its greeting's signature and waits for the peer's before
// the rest, passes the handshake done ahead of the library, and its
// messages all arrive. It needs a Python with pyzmq:
//
//	EXA_PYTHON_ZMQ=/usr/bin/python3 go test ./kvevents -run TestLibzmqPublisher -v
func TestLibzmqPublisher(t *testing.T) {
	py := os.Getenv("EXA_PYTHON_ZMQ")
	if py == "" {
		t.Skip("set EXA_PYTHON_ZMQ to a Python with pyzmq")
	}
	idx := newFakeIndex()
	tr := NewTranslator(podResolver(idx, nil), Limits{})
	sub := NewSubscriber(tr, Options{})
	defer sub.Close()
	addr, err := sub.Bind("tcp://127.0.0.1:0")
	require.NoError(t, err)
	const n = 400
	var lines []string
	for i := range n {
		var hexes []string
		for _, f := range frames(topicA, uint64(i+1), pack(t, arrayBatch(stored{hashes: []uint64{uint64(100 + i)}, tokens: seqTokens(uint32(i), 16), bs: 16}.array()))) {
			hexes = append(hexes, hex.EncodeToString(f))
		}
		lines = append(lines, strings.Join(hexes, " "))
	}
	// The PUB drops what it sends before the subscription reaches it: it
	// sends a message every 5 ms; from the first heard, none is lost.
	script := `import sys, time, zmq
s = zmq.Context().socket(zmq.PUB)
s.connect(sys.argv[1])
for line in sys.stdin:
    s.send_multipart([bytes.fromhex(h) for h in line.split()])
    time.sleep(0.005)
time.sleep(1)
`
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, py, "-c", script, "tcp://"+addr.String())
	cmd.Stdin = strings.NewReader(strings.Join(lines, "\n") + "\n")
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	var st EngineStats
	eventually(t, "every message heard indexed", func() bool {
		st = statsOf(t, tr, topicA)
		return st.Messages >= n/2 && len(idx.keys("10.0.0.1:8000")) == int(st.Messages)
	})
	t.Logf("libzmq publisher: %d of %d messages heard (those before the subscription are dropped by the PUB), guard %+v", st.Messages, n, sub.Endpoints()[0].Guard)
	require.Zero(t, st.Gaps+st.Restarts)
	require.Equal(t, uint64(1), sub.Endpoints()[0].Guard.Accepted)
}
