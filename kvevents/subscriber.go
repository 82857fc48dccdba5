package kvevents

import (
	"context"
	"fmt"
	"log"
	"net"
	"net/netip"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"
)

// DefaultMaxMessageBytes is the default limit of one ZMQ message: 8 MiB,
// room for an event of DefaultMaxTokens token ids at 5 bytes each and
// its hashes. A bound endpoint holds at most about (10 + 2 × MaxConns)
// messages at once (the library's queue, and per connection one being
// read and one waiting for the queue); see docs/kv-events.md for the
// measured figures.
const DefaultMaxMessageBytes = 8 << 20

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
	// MessageTimeout bounds the time from a message's first byte to its
	// last: a connection that stalls mid-message is closed. A connection
	// may stay quiet between messages for any time. Default 10s.
	MessageTimeout time.Duration
	// MaxConns bounds the connections a bound endpoint accepts at once,
	// MaxConnsPerHost those from one source address (a Unix socket's
	// peers, which have none, only count towards MaxConns) unless the Policy is a ConnLimiter
	// that says otherwise. Each connection holds up to two messages.
	// Defaults DefaultMaxConns and DefaultMaxConnsPerHost.
	MaxConns, MaxConnsPerHost int
	// Policy decides, on bound endpoints, which connections may publish
	// and under which topics (see SourcePolicy). Nil accepts every
	// connection and topic: then only the network keeps rogue publishers
	// out.
	Policy SourcePolicy
	// Logf receives connection events and faults. Default: discarded.
	Logf func(format string, args ...any)
}

// Defaults of Options.MaxConns and Options.MaxConnsPerHost: an engine
// publishes on one connection, and reconnects after a failure.
const (
	DefaultMaxConns        = 64
	DefaultMaxConnsPerHost = 8
)

// SourcePolicy binds a bound endpoint's publishers to the engines they
// claim to be. Its methods are called on the connections' goroutines and
// must be safe for concurrent use.
type SourcePolicy interface {
	// AcceptConn is asked when a publisher connects to endpoint from
	// remote (the zero Addr for a Unix socket); an error refuses the
	// connection before its handshake.
	AcceptConn(endpoint string, remote netip.Addr) error
	// AcceptTopic is asked when a connection from remote sends a message
	// under topic, the first time and whenever the topic differs from the
	// last allowed one or Reauthorize was called since; an error closes
	// the connection before the message reaches the Translator. topic is
	// valid only during the call.
	AcceptTopic(endpoint string, remote netip.Addr, topic []byte) error
}

// ConnLimiter is an optional interface of a SourcePolicy: MaxConnsFrom
// returns how many connections may be open at once from remote on
// endpoint (an address of several engines may need several), or 0 for
// Options.MaxConnsPerHost.
type ConnLimiter interface {
	MaxConnsFrom(endpoint string, remote netip.Addr) int
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
	if o.MessageTimeout <= 0 {
		o.MessageTimeout = 10 * time.Second
	}
	if o.MaxConns <= 0 {
		o.MaxConns = DefaultMaxConns
	}
	if o.MaxConnsPerHost <= 0 {
		o.MaxConnsPerHost = DefaultMaxConnsPerHost
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
// gap at the next message, which the engine's replay endpoint fills or
// else clears the engine's entries (see Translator).
//
// A Subscriber is safe for concurrent use.
type Subscriber struct {
	tr     *Translator
	opt    Options
	ctx    context.Context
	cancel context.CancelFunc

	gen atomic.Uint64 // policy generation: see Reauthorize

	mu   sync.Mutex
	subs map[string]*subscription
}

// subscription is one endpoint: its context, its bound socket if any,
// and its goroutine's end.
type subscription struct {
	st     EndpointStatus
	guard  guardCounters
	cancel context.CancelFunc
	sock   zmq4.Socket // Bind only
	done   chan struct{}
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
	// Guard counts what the guard did to the endpoint's connections.
	Guard GuardStats
}

// NewSubscriber returns a Subscriber feeding tr. Close it to stop.
func NewSubscriber(tr *Translator, o Options) *Subscriber {
	registerTransports()
	ctx, cancel := context.WithCancel(context.Background())
	return &Subscriber{tr: tr, opt: o.withDefaults(), ctx: ctx, cancel: cancel, subs: map[string]*subscription{}}
}

// Reauthorize makes every connection ask the Policy again about the next
// message of each topic: call it when the policy's answers change (a
// configuration reload).
func (s *Subscriber) Reauthorize() { s.gen.Add(1) }

func (s *Subscriber) newSocket(ctx context.Context, sub *subscription) zmq4.Socket {
	ctx = withGuard(ctx, &guardConfig{endpoint: sub.st.Endpoint, maxMessage: s.opt.MaxMessageBytes, maxFrames: 16,
		handshake: s.opt.HandshakeTimeout, message: s.opt.MessageTimeout, maxConns: s.opt.MaxConns,
		maxPerHost: s.opt.MaxConnsPerHost, policy: s.opt.Policy, gen: &s.gen, st: &sub.guard})
	logger := log.New(logWriter(s.opt.Logf), "zmq4: ", 0)
	return zmq4.NewSub(ctx, zmq4.WithLogger(logger), zmq4.WithAutomaticReconnect(false),
		zmq4.WithDialerMaxRetries(0), zmq4.WithDialerTimeout(s.opt.HandshakeTimeout))
}

// logWriter adapts Logf to the library's log.Logger.
type logWriter func(string, ...any)

func (w logWriter) Write(p []byte) (int, error) {
	w("%s", strings.TrimSuffix(string(p), "\n"))
	return len(p), nil
}

func (s *Subscriber) register(endpoint string, bound bool) (*subscription, context.Context, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ctx.Err() != nil {
		return nil, nil, fmt.Errorf("kvevents: subscriber closed")
	}
	if _, dup := s.subs[endpoint]; dup {
		return nil, nil, fmt.Errorf("kvevents: endpoint %q is already subscribed", endpoint)
	}
	ctx, cancel := context.WithCancel(s.ctx)
	sub := &subscription{st: EndpointStatus{Endpoint: endpoint, Bound: bound}, cancel: cancel, done: make(chan struct{})}
	s.subs[endpoint] = sub
	return sub, ctx, nil
}

// Bind listens on endpoint (tcp://host:port, port 0 for any, or
// ipc://path) for publishers to connect, and returns the address it
// listens on. An empty host (tcp://:5557) means loopback, 127.0.0.1;
// every interface must be asked for (tcp://0.0.0.0:5557 or tcp://*:5557).
// Messages are handled as received on endpoint, the string given
// (Source.Endpoint).
func (s *Subscriber) Bind(endpoint string) (net.Addr, error) {
	ep, err := guardedEndpoint(endpoint)
	if err != nil {
		return nil, err
	}
	if rest, ok := strings.CutPrefix(ep, "kvtcp://:"); ok {
		ep = "kvtcp://127.0.0.1:" + rest
	}
	sub, ctx, err := s.register(endpoint, true)
	if err != nil {
		return nil, err
	}
	sock := s.newSocket(ctx, sub)
	err = sock.SetOption(zmq4.OptionSubscribe, "")
	if err == nil {
		err = sock.Listen(ep)
	}
	s.mu.Lock()
	live := s.subs[endpoint] == sub // not unsubscribed or closed meanwhile
	if err != nil || !live {
		if live {
			delete(s.subs, endpoint)
		}
		s.mu.Unlock()
		sock.Close()
		sub.cancel()
		close(sub.done)
		if err == nil {
			err = fmt.Errorf("unsubscribed while binding")
		}
		return nil, fmt.Errorf("kvevents: bind %s: %w", endpoint, err)
	}
	sub.sock = sock
	sub.st.Connected = true
	s.mu.Unlock()
	go func() {
		defer close(sub.done)
		s.recv(ctx, sock, sub, true)
	}()
	return sock.Addr(), nil
}

// Connect dials a publisher listening on endpoint (tcp://host:port or
// ipc://path) and keeps reconnecting, with Options.Backoff between
// attempts, until Unsubscribe or Close. It returns an error only for a
// malformed or duplicate endpoint.
func (s *Subscriber) Connect(endpoint string) error {
	ep, err := guardedEndpoint(endpoint)
	if err != nil {
		return err
	}
	sub, ctx, err := s.register(endpoint, false)
	if err != nil {
		return err
	}
	go func() {
		defer close(sub.done)
		s.connectLoop(ctx, sub, ep)
	}()
	return nil
}

func (s *Subscriber) connectLoop(ctx context.Context, sub *subscription, ep string) {
	endpoint := sub.st.Endpoint
	for attempt := 0; ; {
		sock := s.newSocket(ctx, sub)
		err := sock.SetOption(zmq4.OptionSubscribe, "")
		if err == nil {
			err = sock.Dial(ep)
		}
		if err == nil {
			attempt = 0
			s.update(sub, func(st *EndpointStatus) { st.Connected = true; st.Connects++ })
			s.opt.Logf("kvevents: connected to %s", endpoint)
			err = s.recv(ctx, sock, sub, false)
		}
		sock.Close()
		if ctx.Err() != nil {
			return
		}
		s.update(sub, func(st *EndpointStatus) {
			st.Connected = false
			st.Failures++
			st.LastError = err.Error()
		})
		attempt++
		wait := s.opt.Backoff(attempt)
		s.opt.Logf("kvevents: %s: %v; retrying in %v", endpoint, err, wait)
		if !s.opt.Sleep(ctx, wait) {
			return
		}
	}
}

func (s *Subscriber) update(sub *subscription, fn func(*EndpointStatus)) {
	s.mu.Lock()
	fn(&sub.st)
	s.mu.Unlock()
}

// recv hands the socket's messages to the Translator until the socket
// fails: for a bound socket, only when its context ends (one publisher's
// connection ending is not the socket's end); for a dialled one, when its
// connection ends.
func (s *Subscriber) recv(ctx context.Context, sock zmq4.Socket, sub *subscription, bound bool) error {
	for {
		msg, err := sock.Recv()
		if err != nil {
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if !bound {
				return err
			}
			s.update(sub, func(st *EndpointStatus) { st.Failures++; st.LastError = err.Error() })
			s.opt.Logf("kvevents: %s: a publisher's connection ended: %v", sub.st.Endpoint, err)
			continue
		}
		if msg.Type != zmq4.UsrMsg {
			continue
		}
		s.tr.Handle(sub.st.Endpoint, msg.Frames)
	}
}

// Endpoints returns the status of every endpoint, by name.
func (s *Subscriber) Endpoints() []EndpointStatus {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]EndpointStatus, 0, len(s.subs))
	for _, sub := range s.subs {
		st := sub.st
		st.Guard = sub.guard.snapshot()
		out = append(out, st)
	}
	slices.SortFunc(out, func(a, b EndpointStatus) int { return strings.Compare(a.Endpoint, b.Endpoint) })
	return out
}

// Unsubscribe stops listening on, or connecting to, endpoint and waits
// for its goroutine: for a configuration reload. The engines heard there
// keep their blocks in the index until Translator.Reset clears them.
func (s *Subscriber) Unsubscribe(endpoint string) error {
	s.mu.Lock()
	sub, ok := s.subs[endpoint]
	delete(s.subs, endpoint)
	s.mu.Unlock()
	if !ok {
		return fmt.Errorf("kvevents: endpoint %q is not subscribed", endpoint)
	}
	s.stop(sub)
	return nil
}

func (s *Subscriber) stop(sub *subscription) {
	sub.cancel()
	if sub.sock != nil {
		_ = sub.sock.Close() // errors of connections already ended
	}
	<-sub.done
}

// Close stops every endpoint and waits for their goroutines.
func (s *Subscriber) Close() error {
	s.mu.Lock()
	s.cancel()
	subs := s.subs
	s.subs = map[string]*subscription{}
	s.mu.Unlock()
	for _, sub := range subs {
		s.stop(sub)
	}
	return nil
}
