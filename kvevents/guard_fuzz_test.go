package kvevents

import (
	"bytes"
	"errors"
	"net"
	"net/netip"
	"slices"
	"sync/atomic"
	"testing"
	"time"
)

// deadlineConn is the net.Conn under a guardConn in FuzzGuard: only
// deadlines are set on it.
type deadlineConn struct{ net.Conn }

func (deadlineConn) SetReadDeadline(time.Time) error { return nil }

// topicLog is a SourcePolicy that records the topics it is asked about
// and refuses those starting with "bad".
type topicLog struct{ topics [][]byte }

func (*topicLog) AcceptConn(string, netip.Addr) error { return nil }
func (p *topicLog) AcceptTopic(_ string, _ netip.Addr, topic []byte) error {
	p.topics = append(p.topics, bytes.Clone(topic))
	if bytes.HasPrefix(topic, []byte("bad")) {
		return errors.New("refused")
	}
	return nil
}

// guardRun feeds stream to a guard in chunks of the given sizes (cycled)
// and returns the topics its policy was asked about and whether it
// failed the stream.
func guardRun(stream []byte, chunks []byte) ([][]byte, error) {
	pol := &topicLog{}
	g := &guardConfig{maxMessage: 1 << 10, maxFrames: 4, policy: pol, gen: new(atomic.Uint64), st: &guardCounters{}}
	c := newGuardConn(deadlineConn{}, g, nil)
	c.checkTopics, c.remote = true, netip.MustParseAddr("127.0.0.1")
	for i := 0; len(stream) > 0; i++ {
		n := len(stream)
		if len(chunks) > 0 {
			n = min(n, int(chunks[i%len(chunks)])+1)
		}
		if err := c.follow(stream[:n]); err != nil {
			return pol.topics, err
		}
		stream = stream[n:]
	}
	return pol.topics, nil
}

// zmtpStream is a peer's greeting and READY, then messages of frames.
func zmtpStream(msgs ...[][]byte) []byte {
	b := make([]byte, 64)
	b[0], b[9], b[10] = 0xff, 0x7f, 3
	b = append(b, 0x04, 5, 'R', 'E', 'A', 'D', 'Y')
	for _, m := range msgs {
		for i, f := range m {
			flags := byte(0)
			if i < len(m)-1 {
				flags = 1
			}
			if len(f) > 255 {
				b = append(b, flags|2, 0, 0, 0, 0, 0, 0, byte(len(f)>>8), byte(len(f)))
			} else {
				b = append(b, flags, byte(len(f)))
			}
			b = append(b, f...)
		}
	}
	return b
}

// FuzzGuard: the ZMTP guard follows any byte stream without panicking,
// in whatever pieces it arrives: the topics it asks its policy about, and
// whether it fails the stream, do not depend on how the stream is cut;
// every topic asked about is within maxTopicBytes; a stream of messages
// within the limits passes with each message's topic asked about once
// per change.
func FuzzGuard(f *testing.F) {
	long := bytes.Repeat([]byte("x"), 300)
	f.Add(zmtpStream([][]byte{[]byte("kv@a@m"), {0, 0, 0, 0, 0, 0, 0, 1}, []byte("payload")}), []byte{0})
	f.Add(zmtpStream([][]byte{[]byte("kv@a@m"), {1}, {2}}, [][]byte{[]byte("kv@a@m"), {1}, {2}}, [][]byte{[]byte("bad"), {1}}), []byte{3, 1})
	f.Add(zmtpStream([][]byte{{}, long}, [][]byte{long}), []byte{7})
	f.Add(zmtpStream([][]byte{[]byte("t"), {}, {}, {}, {}, {}}), []byte{0, 200})
	f.Add(append(zmtpStream(), 0x04, 4, 'P', 'I', 'N', 'G', 0x02, 0xff, 0, 0, 0, 0, 0, 0, 0), []byte{})
	f.Fuzz(func(t *testing.T, stream, chunks []byte) {
		whole, werr := guardRun(stream, nil)
		cut, cerr := guardRun(stream, chunks)
		if (werr == nil) != (cerr == nil) {
			t.Fatalf("whole stream: %v; in pieces: %v", werr, cerr)
		}
		if !slices.EqualFunc(whole, cut, bytes.Equal) {
			t.Fatalf("topics %q whole, %q in pieces", whole, cut)
		}
		for _, tp := range whole {
			if len(tp) > maxTopicBytes {
				t.Fatalf("a topic of %d bytes reached the policy", len(tp))
			}
		}
	})
}

func TestGuardTopics(t *testing.T) {
	ok := [][]byte{[]byte("kv@a@m"), {1}, []byte("p")}
	other := [][]byte{[]byte("kv@b@m"), {2}, []byte("q")}
	topics, err := guardRun(zmtpStream(ok, ok, other, ok), []byte{2})
	if err != nil {
		t.Fatal(err)
	}
	want := [][]byte{[]byte("kv@a@m"), []byte("kv@b@m"), []byte("kv@a@m")}
	if !slices.EqualFunc(topics, want, bytes.Equal) {
		t.Fatalf("policy asked about %q, want %q (once per change)", topics, want)
	}
	if _, err := guardRun(zmtpStream(ok, [][]byte{[]byte("bad-topic"), {1}, {}}, ok), nil); !errors.Is(err, errGuard) {
		t.Fatalf("a refused topic: %v", err)
	}
	if _, err := guardRun(zmtpStream([][]byte{bytes.Repeat([]byte("t"), maxTopicBytes+1), {1}}), nil); !errors.Is(err, errGuard) {
		t.Fatalf("an over-long topic: %v", err)
	}
}

// Command frames with MORE set continue the message for the library
// (zmq4's Conn.read reads on while MORE is set, whatever the frame), so
// they count towards a message's frames and bytes: before, the guard took
// each command frame for a message of its own and let a peer chain them
// into one message the library held whole, past MaxMessageBytes and the
// frame limit.
func TestGuardCommandFramesWithMore(t *testing.T) {
	body := bytes.Repeat([]byte("c"), 200)
	stream := zmtpStream()
	for range 10 { // 10 frames of 200 bytes: 2,000 bytes, limits 4 frames and 1 KiB
		stream = append(stream, 0x04|0x01, byte(len(body)))
		stream = append(stream, body...)
	}
	stream = append(stream, 0x04, 0)
	if _, err := guardRun(stream, nil); !errors.Is(err, errGuard) {
		t.Fatalf("a message of command frames chained by MORE, over both limits: %v, want the guard to fail it", err)
	}
}
