package picker

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"google.golang.org/grpc/credentials"
)

// The reasons a refused handshake is counted under
// ([HandshakeLog.Failures]); [HandshakeReasons] lists them all.
const (
	// ReasonNoCertificate: the client sent no certificate (mutual TLS).
	ReasonNoCertificate = "no_certificate"
	// ReasonUnknownAuthority: its certificate does not chain to a client CA.
	ReasonUnknownAuthority = "unknown_authority"
	// ReasonBadCertificate: its certificate chains but is expired, not yet
	// valid, or not for client authentication.
	ReasonBadCertificate = "bad_certificate"
	// ReasonSANNotAllowed: its certificate names none of the allowed SANs.
	ReasonSANNotAllowed = "san_not_allowed"
	// ReasonNotTLS: the client did not speak TLS (plaintext gRPC, HTTP).
	ReasonNotTLS = "not_tls"
	// ReasonTimeout: the handshake did not finish in time.
	ReasonTimeout = "timeout"
	// ReasonClosed: the connection closed before a TLS hello (a TCP
	// probe); counted, never logged.
	ReasonClosed = "closed"
	// ReasonOther: any other failure (ALPN, versions, ciphers, ...).
	ReasonOther = "other"
)

var handshakeReasons = [...]string{ReasonNoCertificate, ReasonUnknownAuthority, ReasonBadCertificate, ReasonSANNotAllowed,
	ReasonNotTLS, ReasonTimeout, ReasonClosed, ReasonOther}

// HandshakeReasons returns the reasons a refused handshake is counted
// under, in a fixed order.
func HandshakeReasons() []string { r := handshakeReasons; return r[:] }

// Defaults of [HandshakeLogOptions].
const (
	DefaultHandshakeLogInterval = time.Minute
	DefaultHandshakeLogAddrs    = 1024
)

// HandshakeLogOptions configures a [HandshakeLog]. The zero value is
// usable.
type HandshakeLogOptions struct {
	// Logger receives one warning per refused handshake, rate-limited;
	// nil discards them (they are still counted).
	Logger *slog.Logger
	// Interval is the least time between two lines about one remote IP
	// address; 0 means DefaultHandshakeLogInterval.
	Interval time.Duration
	// MaxAddrs bounds the remote addresses remembered for the rate limit;
	// 0 means DefaultHandshakeLogAddrs. When it is reached, addresses not
	// remembered share one more line per Interval.
	MaxAddrs int
	// Now is the clock; nil means time.Now.
	Now func() time.Time
}

// HandshakeLog counts and logs the TLS handshakes a gRPC server refuses:
// wrap its credentials with [HandshakeLog.Credentials]. grpc-go reports
// them only at its own info level. It is safe for concurrent use; create
// it with NewHandshakeLog.
type HandshakeLog struct {
	opts   HandshakeLogOptions
	counts [len(handshakeReasons)]atomic.Uint64 // by index in handshakeReasons

	mu        sync.Mutex
	addrs     map[string]*addrState // remote IP → its rate limit, at most MaxAddrs
	overflow  addrState             // the addresses not in addrs
	lastSweep time.Time
}

// addrState is the rate limit of one remote address.
type addrState struct {
	last       time.Time // of the last line logged; zero: none
	suppressed uint64    // refusals not logged since
}

// NewHandshakeLog returns a HandshakeLog with opts.
func NewHandshakeLog(opts HandshakeLogOptions) *HandshakeLog {
	if opts.Interval <= 0 {
		opts.Interval = DefaultHandshakeLogInterval
	}
	if opts.MaxAddrs <= 0 {
		opts.MaxAddrs = DefaultHandshakeLogAddrs
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &HandshakeLog{opts: opts, addrs: map[string]*addrState{}}
}

// Failures returns the refused handshakes counted so far, by reason
// (every reason of HandshakeReasons is present).
func (h *HandshakeLog) Failures() map[string]uint64 {
	m := make(map[string]uint64, len(handshakeReasons))
	for i, r := range handshakeReasons {
		m[r] = h.counts[i].Load()
	}
	return m
}

// Failed returns the refused handshakes counted so far under reason; 0
// for a reason not in HandshakeReasons.
func (h *HandshakeLog) Failed(reason string) uint64 {
	for i, r := range handshakeReasons {
		if r == reason {
			return h.counts[i].Load()
		}
	}
	return 0
}

// Credentials wraps c so that every server handshake it refuses is
// counted and logged; everything else is c's.
func (h *HandshakeLog) Credentials(c credentials.TransportCredentials) credentials.TransportCredentials {
	return &loggedCreds{TransportCredentials: c, log: h}
}

type loggedCreds struct {
	credentials.TransportCredentials
	log *HandshakeLog
}

var _ credentials.TransportCredentials = (*loggedCreds)(nil)

func (c *loggedCreds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	conn, info, err := c.TransportCredentials.ServerHandshake(raw)
	if err != nil && !errors.Is(err, credentials.ErrConnDispatched) {
		c.log.Refused(raw.RemoteAddr(), err)
	}
	return conn, info, err
}

func (c *loggedCreds) Clone() credentials.TransportCredentials {
	return &loggedCreds{TransportCredentials: c.TransportCredentials.Clone(), log: c.log}
}

// Refused counts a handshake from remote refused with err and logs it
// unless a line about remote's IP address was logged less than Interval
// ago (the next line says how many were not logged). A connection closed
// before its TLS hello is counted only.
func (h *HandshakeLog) Refused(remote net.Addr, err error) {
	reason := HandshakeReason(err)
	for i, r := range handshakeReasons {
		if r == reason {
			h.counts[i].Add(1)
		}
	}
	if reason == ReasonClosed || h.opts.Logger == nil {
		return
	}
	addr := "unknown"
	if remote != nil {
		addr = remote.String()
	}
	ip := addr
	if host, _, err := net.SplitHostPort(addr); err == nil {
		ip = host
	}
	suppressed, ok := h.allow(ip)
	if !ok {
		return
	}
	h.opts.Logger.Warn("picker: refused TLS handshake", "remote", addr, "reason", reason, "error", err.Error(),
		"not_logged_since_last", suppressed)
}

// allow reports whether a line about ip may be logged now, and how many
// were not logged since the last one.
func (h *HandshakeLog) allow(ip string) (uint64, bool) {
	now := h.opts.Now()
	h.mu.Lock()
	defer h.mu.Unlock()
	st := h.addrs[ip]
	if st == nil && len(h.addrs) >= h.opts.MaxAddrs && now.Sub(h.lastSweep) >= h.opts.Interval {
		h.lastSweep = now
		for a, s := range h.addrs {
			if now.Sub(s.last) >= h.opts.Interval {
				delete(h.addrs, a)
			}
		}
	}
	if st == nil {
		if len(h.addrs) < h.opts.MaxAddrs {
			st = &addrState{}
			h.addrs[ip] = st
		} else {
			st = &h.overflow
		}
	}
	if !st.last.IsZero() && now.Sub(st.last) < h.opts.Interval {
		st.suppressed++
		return 0, false
	}
	n := st.suppressed
	st.last, st.suppressed = now, 0
	return n, true
}

// HandshakeReason classifies a server handshake error as one of
// HandshakeReasons.
func HandshakeReason(err error) string {
	var (
		rhe     tls.RecordHeaderError
		cve     *tls.CertificateVerificationError
		unknown x509.UnknownAuthorityError
		san     *sanError
		ne      net.Error
	)
	switch {
	case errors.Is(err, io.EOF):
		return ReasonClosed
	case errors.As(err, &san):
		return ReasonSANNotAllowed
	case errors.As(err, &unknown):
		return ReasonUnknownAuthority
	case errors.As(err, &cve):
		return ReasonBadCertificate
	case errors.As(err, &rhe):
		return ReasonNotTLS
	case errors.As(err, &ne) && ne.Timeout():
		return ReasonTimeout
	case err != nil && err.Error() == errNoClientCert:
		return ReasonNoCertificate
	}
	return ReasonOther
}

// errNoClientCert is crypto/tls's error, not exported, for a client that
// sent no certificate when one is required (handshake_server.go).
const errNoClientCert = "tls: client didn't provide a certificate"
