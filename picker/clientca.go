package picker

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
)

// A ClientCAError is a client CA file that cannot be used: unreadable, or
// not a PEM bundle of certificates.
type ClientCAError struct {
	Path string // the file at fault
	Err  error
}

func (e *ClientCAError) Error() string {
	return fmt.Sprintf("picker: TLS client CA file %q: %v", e.Path, e.Err)
}

func (e *ClientCAError) Unwrap() error { return e.Err }

// ClientCAs is the pool of CA certificates that client certificates must
// chain to, read from a PEM bundle file, which Reload reads again. It is
// safe for concurrent use; its zero value is not usable (LoadClientCAs).
type ClientCAs struct {
	file string

	mu  sync.Mutex // serializes Reload
	raw []byte     // the file as last loaded, under mu
	cur atomic.Pointer[caPool]
}

// caPool is one loaded bundle.
type caPool struct {
	pool *x509.CertPool
	n    int
}

// LoadClientCAs reads a PEM bundle of CA certificates. An error is a
// *ClientCAError naming the file.
func LoadClientCAs(file string) (*ClientCAs, error) {
	c := &ClientCAs{file: file}
	if _, err := c.Reload(); err != nil {
		return nil, err
	}
	return c, nil
}

// Reload reads the file again and, when it changed, verifies the client
// certificates of the handshakes that follow against the new pool
// (connections already open stay). It reports whether the pool changed. On
// error (a *ClientCAError) the pool used so far stays.
func (c *ClientCAs) Reload() (bool, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	raw, err := os.ReadFile(c.file)
	if err != nil {
		return false, &ClientCAError{Path: c.file, Err: err}
	}
	if c.cur.Load() != nil && bytes.Equal(raw, c.raw) {
		return false, nil
	}
	pool, n, err := parseCABundle(raw)
	if err != nil {
		return false, &ClientCAError{Path: c.file, Err: err}
	}
	c.raw = raw
	c.cur.Store(&caPool{pool: pool, n: n})
	return true, nil
}

// Pool returns the pool used now.
func (c *ClientCAs) Pool() *x509.CertPool { return c.cur.Load().pool }

// Len returns how many certificates the pool used now holds.
func (c *ClientCAs) Len() int { return c.cur.Load().n }

// errNoCA is a bundle without a PEM CERTIFICATE block.
var errNoCA = errors.New("no PEM CERTIFICATE block in it")

// parseCABundle parses a PEM bundle of certificates with crypto/x509:
// every PEM block must be a CERTIFICATE that parses, and there must be one
// at least. Text between blocks (comments, as in the ca-certificates
// bundles) is skipped.
func parseCABundle(raw []byte) (*x509.CertPool, int, error) {
	pool := x509.NewCertPool()
	n := 0
	for rest := raw; ; {
		var b *pem.Block
		if b, rest = pem.Decode(rest); b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			return nil, 0, fmt.Errorf("PEM block %d is a %q, not a CERTIFICATE", n+1, b.Type)
		}
		cert, err := x509.ParseCertificate(b.Bytes)
		if err != nil {
			return nil, 0, fmt.Errorf("certificate %d: %w", n+1, err)
		}
		pool.AddCert(cert)
		n++
	}
	if n == 0 {
		return nil, 0, errNoCA
	}
	return pool, n, nil
}

// MutualTLSConfig returns TLSConfig(get) that also requires a client
// certificate on every connection and verifies it (tls.RequireAndVerifyClientCert):
// it must chain to the pool cas uses at the time of the handshake, be
// valid now and allow client authentication (extended key usage
// clientAuth, or none). When sans is not empty the certificate must also
// name one of them as a subject alternative name of the form its text
// has: an IP address as an IP SAN, a value with a colon (a URI such as
// the SPIFFE ID spiffe://cluster.local/ns/gw/sa/envoy) as a URI SAN, one
// with an @ as an email SAN, any other as a DNS SAN (without regard to
// case); empty sans accept any name. The client CAs' names go in the
// certificate request.
func MutualTLSConfig(get func(*tls.ClientHelloInfo) (*tls.Certificate, error), cas *ClientCAs, sans []string) *tls.Config {
	base := TLSConfig(get)
	base.ClientAuth = tls.RequireAndVerifyClientCert
	if len(sans) > 0 {
		allowed := make([]allowedSAN, len(sans))
		for i, s := range sans {
			allowed[i] = parseAllowedSAN(s)
		}
		base.VerifyConnection = func(cs tls.ConnectionState) error { return checkClientSAN(cs, allowed) }
	}
	var last atomic.Pointer[tls.Config] // the config of the pool last used
	base.ClientCAs = cas.Pool()
	base.GetConfigForClient = func(*tls.ClientHelloInfo) (*tls.Config, error) {
		pool := cas.Pool()
		if cfg := last.Load(); cfg != nil && cfg.ClientCAs == pool {
			return cfg, nil
		}
		cfg := base.Clone()
		cfg.GetConfigForClient = nil
		cfg.ClientCAs = pool
		last.Store(cfg)
		return cfg, nil
	}
	return base
}

// checkClientSAN accepts a connection whose client certificate names one
// of allowed as a subject alternative name of its form.
func checkClientSAN(cs tls.ConnectionState, allowed []allowedSAN) error {
	if len(cs.PeerCertificates) == 0 {
		return errors.New("picker: no client certificate")
	}
	leaf := cs.PeerCertificates[0]
	values := make([]string, len(allowed))
	for i, a := range allowed {
		if a.matches(leaf) {
			return nil
		}
		values[i] = a.value
	}
	return &sanError{names: sanNames(leaf), allowed: values}
}

// sanError is a client certificate naming none of the allowed SANs.
type sanError struct{ names, allowed []string }

func (e *sanError) Error() string {
	return fmt.Sprintf("picker: client certificate names %q, none of the allowed SANs %q", e.names, e.allowed)
}
