package kvevents

import (
	"context"
	"encoding/binary"
	"io"
	"net"
	"strconv"
	"testing"
	"time"

	"github.com/examlops/gateway/internal/testport"
	"github.com/go-zeromq/zmq4"
	"github.com/stretchr/testify/require"
)

// testPub is a ZMQ PUB socket of the library, as an engine publishes.
type testPub struct {
	t     *testing.T
	sock  zmq4.Socket
	topic string
	seq   uint64
}

func newTestPub(t *testing.T, topic string) *testPub {
	p := &testPub{t: t, sock: zmq4.NewPub(context.Background()), topic: topic}
	t.Cleanup(func() { p.sock.Close() })
	return p
}

func (p *testPub) send(batch any) {
	p.t.Helper()
	p.seq++
	require.NoError(p.t, p.sock.Send(zmq4.NewMsgFrom(frames(p.topic, p.seq, pack(p.t, batch))...)))
}

// eventually polls cond every 10 ms until it holds or 10 s pass: real
// sockets are involved.
func eventually(t *testing.T, what string, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); !cond(); {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// warmUp sends clears until the subscriber has heard one: a PUB drops
// what it publishes before the SUB's subscription reaches it.
func warmUp(t *testing.T, p *testPub, tr *Translator) {
	t.Helper()
	messages := func() uint64 {
		st, _ := tr.Stats()
		for _, s := range st {
			if s.Source.Topic == p.topic {
				return s.Messages
			}
		}
		return 0
	}
	before := messages()
	eventually(t, "a first message", func() bool {
		p.send(arrayBatch(clearedArray()))
		return messages() > before
	})
}

func freePort(t *testing.T) int {
	t.Helper()
	return testport.Port(t) // outside the ephemeral ports: see package testport
}

// TestSubscriberBind: an engine's PUB connects to the bound endpoint, as
// llm-d-inference-sim's does; its events reach the index.
func TestSubscriberBind(t *testing.T) {
	idx := newFakeIndex()
	tr := NewTranslator(podResolver(idx, nil), Limits{})
	sub := NewSubscriber(tr, Options{})
	defer sub.Close()
	addr, err := sub.Bind("tcp://127.0.0.1:0")
	require.NoError(t, err)
	_, err = sub.Bind("tcp://127.0.0.1:0")
	require.ErrorContains(t, err, "already subscribed")
	_, err = sub.Bind("udp://127.0.0.1:0")
	require.ErrorContains(t, err, `"udp://127.0.0.1:0": want tcp://host:port or ipc://path`)

	pub := newTestPub(t, topicA)
	require.NoError(t, pub.sock.Dial("tcp://"+addr.String()))
	warmUp(t, pub, tr)
	prompt := seqTokens(1, 32)
	pub.send(arrayBatch(stored{hashes: []uint64{1}, tokens: prompt[:16], bs: 16}.array()))
	pub.send(mapBatch(stored{hashes: []uint64{2}, parent: uint64(1), tokens: prompt[16:], bs: 16}.mapped()))
	want := sortedKey(mustKey(t, "m", prompt))
	eventually(t, "both blocks indexed", func() bool { return slicesEqual(idx.keys("10.0.0.1:8000"), want) })
	st := sub.Endpoints()
	require.Len(t, st, 1)
	require.True(t, st[0].Bound)
	require.Equal(t, "tcp://127.0.0.1:0", st[0].Endpoint)
	es := statsOf(t, tr, topicA)
	require.Equal(t, "tcp://127.0.0.1:0", es.Source.Endpoint)
	require.Zero(t, es.Dropped)
}

func slicesEqual(a, b []uint64) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// TestSubscriberConnectReconnects: connecting to a publisher that is not
// up yet backs off as configured; when it comes up the events flow; when
// it goes away and comes back (a restart: its sequence starts over), the
// subscriber reconnects and the engine's stale blocks are cleared.
func TestSubscriberConnectReconnects(t *testing.T) {
	idx := newFakeIndex()
	tr := NewTranslator(podResolver(idx, nil), Limits{})
	sleeps, release := make(chan time.Duration), make(chan struct{})
	sub := NewSubscriber(tr, Options{
		Backoff: ExponentialBackoff(10*time.Millisecond, 40*time.Millisecond),
		Sleep: func(ctx context.Context, d time.Duration) bool {
			select {
			case sleeps <- d:
			case <-ctx.Done():
				return false
			}
			select {
			case <-release:
				return true
			case <-ctx.Done():
				return false
			}
		},
	})
	defer sub.Close()
	port := freePort(t)
	ep := "tcp://127.0.0.1:" + strconv.Itoa(port)
	require.NoError(t, sub.Connect(ep))
	for i, want := range []time.Duration{10, 20, 40, 40} {
		require.Equal(t, want*time.Millisecond, <-sleeps, "nobody listens yet")
		if i < 3 {
			release <- struct{}{}
		}
	}
	// The subscriber is asleep: the publisher comes up, and on waking the
	// subscriber connects.
	pub := newTestPub(t, topicA)
	require.NoError(t, pub.sock.Listen(ep))
	release <- struct{}{}
	warmUp(t, pub, tr)
	pub.send(arrayBatch(stored{hashes: []uint64{1}, tokens: seqTokens(1, 16), bs: 16}.array()))
	eventually(t, "the block indexed", func() bool { return len(idx.keys("10.0.0.1:8000")) == 1 })
	require.True(t, sub.Endpoints()[0].Connected)

	require.NoError(t, pub.sock.Close())
	require.Equal(t, 10*time.Millisecond, <-sleeps, "the backoff starts over after a connection")
	require.False(t, sub.Endpoints()[0].Connected)
	pub2 := newTestPub(t, topicA)
	require.NoError(t, pub2.sock.Listen(ep))
	release <- struct{}{}
	warmUp(t, pub2, tr)
	pub2.send(arrayBatch(stored{hashes: []uint64{5}, tokens: seqTokens(5, 16), bs: 16}.array()))
	eventually(t, "the new engine's block alone", func() bool {
		k := idx.keys("10.0.0.1:8000")
		return len(k) == 1 && k[0] == mustKey(t, "m", seqTokens(5, 16))[0]
	})
	es := statsOf(t, tr, topicA)
	require.Equal(t, uint64(1), es.Restarts+es.Gaps, "the new sequence was noticed: %+v", es)
	st := sub.Endpoints()[0]
	require.Equal(t, uint64(2), st.Connects)
	require.Equal(t, uint64(5), st.Failures, "four failed dials, one connection ended")
	require.NotEmpty(t, st.LastError)
}

// zmtpPeer speaks just enough ZMTP 3 (NULL mechanism) to pose as a PUB.
func zmtpPeer(t *testing.T, addr string) net.Conn {
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { c.Close() })
	greetAsPub(t, c)
	return c
}

// greetAsPub sends a PUB's greeting and READY on c.
func greetAsPub(t *testing.T, c net.Conn) {
	greeting := make([]byte, 64)
	greeting[0], greeting[9], greeting[10] = 0xff, 0x7f, 3
	copy(greeting[12:], "NULL")
	ready := []byte{0x04, 25, 5, 'R', 'E', 'A', 'D', 'Y', 11}
	ready = append(ready, "Socket-Type"...)
	ready = append(ready, 0, 0, 0, 3, 'P', 'U', 'B')
	_, err := c.Write(append(greeting, ready...))
	require.NoError(t, err)
}

// closedByPeer reads until the connection ends.
func closedByPeer(t *testing.T, c net.Conn) {
	t.Helper()
	require.NoError(t, c.SetReadDeadline(time.Now().Add(10*time.Second)))
	_, err := io.Copy(io.Discard, c)
	if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatal("the subscriber kept the connection open")
	}
}

// TestSubscriberGuard: a peer announcing a 1 TiB frame, or sending a
// message of too many frames, is disconnected without the subscriber
// allocating it; a peer that never completes its handshake does not stall
// the others; a real publisher is served afterwards.
func TestSubscriberGuard(t *testing.T) {
	idx := newFakeIndex()
	tr := NewTranslator(podResolver(idx, nil), Limits{})
	sub := NewSubscriber(tr, Options{HandshakeTimeout: 300 * time.Millisecond, MaxMessageBytes: 4096})
	defer sub.Close()
	addr, err := sub.Bind("tcp://127.0.0.1:0")
	require.NoError(t, err)

	silent, err := net.Dial("tcp", addr.String())
	require.NoError(t, err)
	defer silent.Close()

	huge := zmtpPeer(t, addr.String())
	hdr := []byte{0x02, 0, 0, 0, 0, 0, 0, 0, 0} // LONG frame
	binary.BigEndian.PutUint64(hdr[1:], 1<<40)
	_, err = huge.Write(hdr)
	require.NoError(t, err)
	closedByPeer(t, huge)

	many := zmtpPeer(t, addr.String())
	for range 20 {
		// MORE, 1 byte. The guard may close the connection before the
		// last writes (a reset then fails them): closedByPeer checks it.
		if _, err = many.Write([]byte{0x01, 1, 'x'}); err != nil {
			break
		}
	}
	closedByPeer(t, many)
	closedByPeer(t, silent)

	pub := newTestPub(t, topicA)
	require.NoError(t, pub.sock.Dial("tcp://"+addr.String()))
	warmUp(t, pub, tr)
	pub.send(arrayBatch(stored{hashes: []uint64{1}, tokens: seqTokens(1, 16), bs: 16}.array()))
	eventually(t, "the block indexed", func() bool { return len(idx.keys("10.0.0.1:8000")) == 1 })
	_, glob := tr.Stats()
	require.Zero(t, glob.MalformedFrames, "the guard's victims never reach the translator")
}

func TestExponentialBackoff(t *testing.T) {
	b := ExponentialBackoff(100*time.Millisecond, time.Second)
	var got []time.Duration
	for a := 1; a <= 6; a++ {
		got = append(got, b(a))
	}
	require.Equal(t, []time.Duration{100e6, 200e6, 400e6, 800e6, 1e9, 1e9}, got)
}

// TestSubscriberUnsubscribe: an endpoint can be dropped (a reload) and
// taken again; its port is free once Unsubscribe returns.
func TestSubscriberUnsubscribe(t *testing.T) {
	tr := NewTranslator(podResolver(newFakeIndex(), nil), Limits{})
	sub := NewSubscriber(tr, Options{})
	defer sub.Close()
	port := freePort(t)
	ep := "tcp://127.0.0.1:" + strconv.Itoa(port)
	_, err := sub.Bind(ep)
	require.NoError(t, err)
	require.NoError(t, sub.Connect("tcp://127.0.0.1:1"))
	require.Len(t, sub.Endpoints(), 2)
	require.NoError(t, sub.Unsubscribe(ep))
	require.NoError(t, sub.Unsubscribe("tcp://127.0.0.1:1"))
	require.Empty(t, sub.Endpoints())
	require.ErrorContains(t, sub.Unsubscribe(ep), "not subscribed")
	l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
	require.NoError(t, err, "the port is released")
	l.Close()
	_, err = sub.Bind(ep)
	require.NoError(t, err)
	require.NoError(t, sub.Close())
	_, err = sub.Bind(ep)
	require.ErrorContains(t, err, "closed")
}

// rawSend writes one ZMTP message of short frames on c.
func rawSend(t *testing.T, c net.Conn, frames [][]byte) {
	t.Helper()
	var b []byte
	for i, f := range frames {
		flags := byte(0)
		if i < len(frames)-1 {
			flags = 1
		}
		require.Less(t, len(f), 256)
		b = append(b, flags, byte(len(f)))
		b = append(b, f...)
	}
	_, err := c.Write(b)
	require.NoError(t, err)
}

// TestSubscriberStalled: the issue-21 finding. Connections that greet and
// stall mid-message used to be kept with no deadline, filling MaxConns, so
// that a real publisher connecting afterwards was refused. Now each is
// closed MessageTimeout after its message began; a connection quiet
// between messages is kept; the connections refused while full, and the
// timeouts, are counted; a real publisher connecting afterwards is heard.
func TestSubscriberStalled(t *testing.T) {
	idx := newFakeIndex()
	tr := NewTranslator(podResolver(idx, nil), Limits{})
	sub := NewSubscriber(tr, Options{HandshakeTimeout: 5 * time.Second, MessageTimeout: 300 * time.Millisecond, MaxConns: 4})
	defer sub.Close()
	addr, err := sub.Bind("tcp://127.0.0.1:0")
	require.NoError(t, err)
	guard := func() GuardStats { return sub.Endpoints()[0].Guard }

	// A quiet publisher: one whole message, then nothing.
	quiet := zmtpPeer(t, addr.String())
	rawSend(t, quiet, frames(topicB, 1, pack(t, arrayBatch(stored{hashes: []uint64{7}, tokens: seqTokens(7, 16), bs: 16}.array()))))
	eventually(t, "the quiet publisher's block", func() bool { return len(idx.keys("10.0.0.2:8000")) == 1 })

	var stalled []net.Conn
	for range 3 {
		c := zmtpPeer(t, addr.String())
		_, err := c.Write([]byte{0x01, 200, 'k', 'v'}) // a 200-byte topic frame, 2 bytes of it
		require.NoError(t, err)
		stalled = append(stalled, c)
	}
	eventually(t, "4 connections open", func() bool { return guard().Open == 4 })
	extra := zmtpPeer(t, addr.String())
	closedByPeer(t, extra)
	require.Equal(t, uint64(1), guard().Full, "refused while MaxConns are open")

	for _, c := range stalled {
		closedByPeer(t, c)
	}
	eventually(t, "timeouts counted", func() bool { return guard().MessageTimeouts == 3 })
	require.Equal(t, uint64(1), guard().Open, "the quiet publisher is kept")

	// The quiet publisher, idle for longer than MessageTimeout, still
	// publishes; a real publisher connecting now is heard.
	rawSend(t, quiet, frames(topicB, 2, pack(t, arrayBatch(stored{hashes: []uint64{8}, parent: uint64(7), tokens: seqTokens(8, 16), bs: 16}.array()))))
	eventually(t, "the quiet publisher's second block", func() bool { return len(idx.keys("10.0.0.2:8000")) == 2 })
	pub := newTestPub(t, topicA)
	require.NoError(t, pub.sock.Dial("tcp://"+addr.String()))
	warmUp(t, pub, tr)
	for i := range 300 {
		pub.send(arrayBatch(stored{hashes: []uint64{uint64(100 + i)}, tokens: seqTokens(uint32(i), 16), bs: 16}.array()))
	}
	eventually(t, "all 300 blocks indexed", func() bool { return len(idx.keys("10.0.0.1:8000")) == 300 })
	require.Zero(t, guard().HandshakeTimeouts)
}

// TestSubscriberHandshakeTimeout: a connection that never greets is
// closed after HandshakeTimeout, counted.
func TestSubscriberHandshakeTimeout(t *testing.T) {
	tr := NewTranslator(podResolver(newFakeIndex(), nil), Limits{})
	sub := NewSubscriber(tr, Options{HandshakeTimeout: 200 * time.Millisecond})
	defer sub.Close()
	addr, err := sub.Bind("tcp://127.0.0.1:0")
	require.NoError(t, err)
	silent, err := net.Dial("tcp", addr.String())
	require.NoError(t, err)
	defer silent.Close()
	closedByPeer(t, silent)
	eventually(t, "counted", func() bool { return sub.Endpoints()[0].Guard.HandshakeTimeouts == 1 })
	require.Zero(t, sub.Endpoints()[0].Guard.MessageTimeouts)
}

// TestSubscriberPerHost: at most MaxConnsPerHost connections from one
// address; another address is still served.
func TestSubscriberPerHost(t *testing.T) {
	tr := NewTranslator(podResolver(newFakeIndex(), nil), Limits{})
	sub := NewSubscriber(tr, Options{MaxConnsPerHost: 2})
	defer sub.Close()
	addr, err := sub.Bind("tcp://127.0.0.1:0")
	require.NoError(t, err)
	guard := func() GuardStats { return sub.Endpoints()[0].Guard }
	from := func(ip string) net.Conn {
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(ip)}}
		c, err := d.Dial("tcp", addr.String())
		require.NoError(t, err)
		t.Cleanup(func() { c.Close() })
		greetAsPub(t, c)
		return c
	}
	from("127.0.0.21")
	from("127.0.0.21")
	eventually(t, "2 open", func() bool { return guard().Open == 2 })
	closedByPeer(t, from("127.0.0.21"))
	require.Equal(t, uint64(1), guard().HostFull)
	from("127.0.0.22")
	eventually(t, "another host served", func() bool { return guard().Open == 3 })
}

// TestSubscriberBindLoopbackByDefault: a bind endpoint without a host
// listens on loopback only.
func TestSubscriberBindLoopbackByDefault(t *testing.T) {
	sub := NewSubscriber(NewTranslator(podResolver(newFakeIndex(), nil), Limits{}), Options{})
	defer sub.Close()
	addr, err := sub.Bind("tcp://:0")
	require.NoError(t, err)
	require.True(t, addr.(*net.TCPAddr).IP.IsLoopback(), "%v", addr)
}
