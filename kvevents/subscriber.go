package kvevents

import (
	"context"
	"fmt"
	"log"
	"net"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-zeromq/zmq4"
)

// DefaultMaxMessageBytes is the default limit of one ZMQ message: 16 MiB,
// some 3M token ids.
const DefaultMaxMessageBytes = 16 << 20

// Options configure a Subscriber. The zero value is valid: every field
// has a default.
type Options struct {
	// Backoff is the wait before the attempt-th consecutive attempt to
	// reconnect (attempt 1, 2...). Default ExponentialBackoff(100ms, 5s).
	Backoff func(attempt int) time.Duration
	// Sleep waits d, or until ctx is done, when it returns false. Default
	// a timer; tests inject their own clock.
	Sleep func(ctx context.Context, d time.Duration) bool
	// MaxMessageBytes is the largest message accepted; a peer sending a
	// larger one is disconnected. Default DefaultMaxMessageBytes.
	MaxMessageBytes int
	// HandshakeTimeout bounds a connection's ZMTP greeting and handshake,
	// and a dial. Default 10s.
	HandshakeTimeout time.Duration
	// MaxConns bounds the connections a bound endpoint accepts at once
	// (each buffers up to 10 messages). Default 1024.
	MaxConns int
	// Logf receives connection events and faults. Default: discarded.
	Logf func(format string, args ...any)
}

// ExponentialBackoff waits lo before the first retry, doubling up to hi.
func ExponentialBackoff(lo, hi time.Duration) func(int) time.Duration {
	return func(attempt int) time.Duration {
		d := lo
		for i := 1; i < attempt && d < hi; i++ {
			d *= 2
		}
		return min(d, hi)
	}
}

func (o Options) withDefaults() Options {
	if o.Backoff == nil {
		o.Backoff = ExponentialBackoff(100*time.Millisecond, 5*time.Second)
	}
	if o.Sleep == nil {
		o.Sleep = func(ctx context.Context, d time.Duration) bool {
			t := time.NewTimer(d)
			defer t.Stop()
			select {
			case <-t.C:
				return true
			case <-ctx.Done():
				return false
			}
		}
	}
	if o.MaxMessageBytes <= 0 {
		o.MaxMessageBytes = DefaultMaxMessageBytes
	}
	if o.HandshakeTimeout <= 0 {
		o.HandshakeTimeout = 10 * time.Second
	}
	if o.MaxConns <= 0 {
		o.MaxConns = 1024
	}
	if o.Logf == nil {
		o.Logf = func(string, ...any) {}
	}
	return o
}

// Subscriber receives KV-event messages over ZMQ SUB sockets and hands
// them to a Translator, on one goroutine per socket.
//
// Bind listens where publishers connect: llm-d-inference-sim's PUB
// connects to its --zmq-endpoint, and vLLM's does when its endpoint names
// a host (not *). Connect dials a publisher that listens, as vLLM's
// default tcp://*:5557 does, and reconnects with backoff whenever the
// connection fails or ends; messages lost meanwhile show up as a sequence
// gap, which clears the engine's entries (see Translator).
//
// A Subscriber is safe for concurrent use.
type Subscriber struct {
	tr     *Translator
	opt    Options
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu     sync.Mutex
	socks  []zmq4.Socket // bound sockets
	status map[string]*EndpointStatus
}

// EndpointStatus describes one endpoint of a Subscriber.
type EndpointStatus struct {
	Endpoint string
	// Bound is true for Bind, false for Connect.
	Bound bool
	// Connected is true while a Connect endpoint is connected (a Bind
	// endpoint is always listening).
	Connected bool
	// Connects counts successful connections; Failures failed attempts
	// and connections that ended.
	Connects, Failures uint64
	// LastError is the last failure.
	LastError string
}

// NewSubscriber returns a Subscriber feeding tr. Close it to stop.
func NewSubscriber(tr *Translator, o Options) *Subscriber {
	registerTransports()
	ctx, cancel := context.WithCancel(context.Background())
	return &Subscriber{tr: tr, opt: o.withDefaults(), ctx: ctx, cancel: cancel, status: map[string]*EndpointStatus{}}
}

func (s *Subscriber) socketContext() context.Context {
	return withGuard(s.ctx, &guardConfig{maxMessage: s.opt.MaxMessageBytes, maxFrames: 16,
		handshake: s.opt.HandshakeTimeout, maxConns: s.opt.MaxConns})
}

func (s *Subscriber) newSocket() zmq4.Socket {
	logger := log.New(logWriter(s.opt.Logf), "zmq4: ", 0)
	return zmq4.NewSub(s.socketContext(), zmq4.WithLogger(logger), zmq4.WithAutomaticReconnect(false),
		zmq4.WithDialerMaxRetries(0), zmq4.WithDialerTimeout(s.opt.HandshakeTimeout))
}

// logWriter adapts Logf to the library's log.Logger.
type logWriter func(string, ...any)

func (w logWriter) Write(p []byte) (int, error) {
	w("%s", strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

func (s *Subscriber) register(endpoint string, bound bool) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ctx.Err() != nil {
		return fmt.Errorf("kvevents: subscriber closed")
	}
	if _, dup := s.status[endpoint]; dup {
		return fmt.Errorf("kvevents: endpoint %q is already subscribed", endpoint)
	}
	s.status[endpoint] = &EndpointStatus{Endpoint: endpoint, Bound: bound}
	return nil
}

// Bind listens on endpoint (tcp://host:port, port 0 for any, or
// ipc://path) for publishers to connect, and returns the address it
// listens on. Messages are handled as received on endpoint, the string
// given (Source.Endpoint).
func (s *Subscriber) Bind(endpoint string) (net.Addr, error) {
	ep, err := guardedEndpoint(endpoint)
	if err != nil {
		return nil, err
	}
	if err := s.register(endpoint, true); err != nil {
		return nil, err
	}
	sock := s.newSocket()
	if err := sock.SetOption(zmq4.OptionSubscribe, ""); err == nil {
		err = sock.Listen(ep)
	}
	if err != nil {
		sock.Close()
		s.mu.Lock()
		delete(s.status, endpoint)
		s.mu.Unlock()
		return nil, fmt.Errorf("kvevents: bind %s: %w", endpoint, err)
	}
	s.mu.Lock()
	s.socks = append(s.socks, sock)
	s.status[endpoint].Connected = true
	s.mu.Unlock()
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.recv(sock, endpoint, true)
	}()
	return sock.Addr(), nil
}

// Connect dials a publisher listening on endpoint (tcp://host:port or
// ipc://path) and keeps reconnecting, with Options.Backoff between
// attempts, until Close. It returns an error only for a malformed or
// duplicate endpoint.
func (s *Subscriber) Connect(endpoint string) error {
	ep, err := guardedEndpoint(endpoint)
	if err != nil {
		return err
	}
	if err := s.register(endpoint, false); err != nil {
		return err
	}
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		s.connectLoop(endpoint, ep)
	}()
	return nil
}

func (s *Subscriber) connectLoop(endpoint, ep string) {
	for attempt := 0; ; {
		sock := s.newSocket()
		err := sock.SetOption(zmq4.OptionSubscribe, "")
		if err == nil {
			err = sock.Dial(ep)
		}
		if err == nil {
			attempt = 0
			s.update(endpoint, func(st *EndpointStatus) { st.Connected = true; st.Connects++ })
			s.opt.Logf("kvevents: connected to %s", endpoint)
			err = s.recv(sock, endpoint, false)
		}
		sock.Close()
		if s.ctx.Err() != nil {
			return
		}
		s.update(endpoint, func(st *EndpointStatus) {
			st.Connected = false
			st.Failures++
			st.LastError = err.Error()
		})
		attempt++
		wait := s.opt.Backoff(attempt)
		s.opt.Logf("kvevents: %s: %v; retrying in %v", endpoint, err, wait)
		if !s.opt.Sleep(s.ctx, wait) {
			return
		}
	}
}

func (s *Subscriber) update(endpoint string, fn func(*EndpointStatus)) {
	s.mu.Lock()
	fn(s.status[endpoint])
	s.mu.Unlock()
}

// recv hands the socket's messages to the Translator until the socket
// fails: for a bound socket, only when the Subscriber closes (one
// publisher's connection ending is not the socket's end); for a dialled
// one, when its connection ends.
func (s *Subscriber) recv(sock zmq4.Socket, endpoint string, bound bool) error {
	for {
		msg, err := sock.Recv()
		if err != nil {
			if s.ctx.Err() != nil {
				return s.ctx.Err()
			}
			if !bound {
				return err
			}
			s.update(endpoint, func(st *EndpointStatus) { st.Failures++; st.LastError = err.Error() })
			s.opt.Logf("kvevents: %s: a publisher's connection ended: %v", endpoint, err)
			continue
		}
		if msg.Type != zmq4.UsrMsg {
			continue
		}
		s.tr.Handle(endpoint, msg.Frames)
	}
}

// Endpoints returns the status of every endpoint, by name.
func (s *Subscriber) Endpoints() []EndpointStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]EndpointStatus, 0, len(s.status))
	for _, st := range s.status {
		out = append(out, *st)
	}
	slices.SortFunc(out, func(a, b EndpointStatus) int { return strings.Compare(a.Endpoint, b.Endpoint) })
	return out
}

// Close stops every socket and waits for their goroutines.
func (s *Subscriber) Close() error {
	s.cancel()
	s.mu.Lock()
	socks := s.socks
	s.socks = nil
	s.mu.Unlock()
	for _, sock := range socks {
		_ = sock.Close() // errors of connections already ended
	}
	s.wg.Wait()
	return nil
}
