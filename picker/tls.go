package picker

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"sync"
	"sync/atomic"
	"time"
)

// SelfSignedValidity is how long a SelfSigned certificate is valid: ten
// years, as GIE v1.5.0's endpoint picker makes its own
// (internal/tls/tls.go). It is made anew at every start.
const SelfSignedValidity = 10 * 365 * 24 * time.Hour

// TLSConfig returns the TLS configuration of the picker's gRPC server:
// the certificate get returns (KeyPair.GetCertificate, or one that
// returns a fixed certificate), TLS 1.2 or later, ALPN "h2". Pass it to
// credentials.NewTLS. Clients must offer ALPN h2: grpc-go's server refuses
// TLS connections that negotiate no protocol.
func TLSConfig(get func(*tls.ClientHelloInfo) (*tls.Certificate, error)) *tls.Config {
	return &tls.Config{GetCertificate: get, MinVersion: tls.VersionTLS12, NextProtos: []string{"h2"}}
}

// SelfSigned returns a new self-signed server certificate for hosts (DNS
// names or IP addresses, its subject alternative names), valid from an hour
// before now for SelfSignedValidity, with a new ECDSA P-256 key. GIE's
// endpoint picker serves such a certificate when started with
// --secure-serving and no --cert-path, with an RSA 4,096-bit key, which
// takes seconds to generate on a small machine; P-256 takes a millisecond.
// No client can verify it without trusting this very certificate: it
// encrypts, it does not authenticate.
func SelfSigned(hosts []string, now time.Time) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("picker: self-signed certificate: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 128))
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("picker: self-signed certificate: %w", err)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{Organization: []string{"exa endpoint picker"}, CommonName: "exa-picker"},
		NotBefore:             now.Add(-time.Hour).UTC(),
		NotAfter:              now.Add(SelfSignedValidity).UTC(),
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			tmpl.IPAddresses = append(tmpl.IPAddresses, ip)
		} else if h != "" {
			tmpl.DNSNames = append(tmpl.DNSNames, h)
		}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("picker: self-signed certificate: %w", err)
	}
	leaf, err := x509.ParseCertificate(der)
	if err != nil {
		return tls.Certificate{}, fmt.Errorf("picker: self-signed certificate: %w", err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key, Leaf: leaf}, nil
}

// A KeyPairError is a certificate or key file that cannot be served.
type KeyPairError struct {
	// Key is true when the key file is at fault (unreadable, not a key, or
	// not the certificate's key), false for the certificate file.
	Key bool
	// Path is the file at fault.
	Path string
	Err  error
}

func (e *KeyPairError) Error() string {
	which := "certificate"
	if e.Key {
		which = "key"
	}
	return fmt.Sprintf("picker: TLS %s file %q: %v", which, e.Path, e.Err)
}

func (e *KeyPairError) Unwrap() error { return e.Err }

// KeyPair is a TLS certificate and its private key read from PEM files,
// which Reload reads again. Its GetCertificate serves the last pair read
// successfully. It is safe for concurrent use.
type KeyPair struct {
	certFile, keyFile string

	mu              sync.Mutex // serializes Reload
	certPEM, keyPEM []byte     // the files as last loaded, under mu
	cur             atomic.Pointer[tls.Certificate]
}

// LoadKeyPair reads a PEM certificate file (the server's certificate
// first, then any intermediates) and the PEM file of its private key
// (PKCS #1, PKCS #8 or EC). An error is a *KeyPairError naming the file at
// fault.
func LoadKeyPair(certFile, keyFile string) (*KeyPair, error) {
	k := &KeyPair{certFile: certFile, keyFile: keyFile}
	if _, err := k.Reload(); err != nil {
		return nil, err
	}
	return k, nil
}

// Reload reads the files again and, when either changed, serves the new
// pair to the handshakes that follow (connections already open keep
// theirs). It reports whether the pair changed. On error (a *KeyPairError:
// say, a key written before its certificate) the pair served so far stays.
func (k *KeyPair) Reload() (bool, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	certPEM, err := os.ReadFile(k.certFile)
	if err != nil {
		return false, &KeyPairError{Path: k.certFile, Err: err}
	}
	keyPEM, err := os.ReadFile(k.keyFile)
	if err != nil {
		return false, &KeyPairError{Key: true, Path: k.keyFile, Err: err}
	}
	if k.cur.Load() != nil && bytes.Equal(certPEM, k.certPEM) && bytes.Equal(keyPEM, k.keyPEM) {
		return false, nil
	}
	cert, err := parseKeyPair(certPEM, keyPEM, k.certFile, k.keyFile)
	if err != nil {
		return false, err
	}
	k.certPEM, k.keyPEM = certPEM, keyPEM
	k.cur.Store(&cert)
	return true, nil
}

// Certificate returns the pair served now.
func (k *KeyPair) Certificate() *tls.Certificate { return k.cur.Load() }

// GetCertificate returns the pair served now; it is a
// tls.Config.GetCertificate.
func (k *KeyPair) GetCertificate(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	return k.cur.Load(), nil
}

// errNoCertificate is a certificate file without a PEM CERTIFICATE block.
var errNoCertificate = errors.New("no PEM CERTIFICATE block in it")

// parseKeyPair checks the certificate file on its own, so that its faults
// are told apart from the key's, then pairs it with the key.
func parseKeyPair(certPEM, keyPEM []byte, certFile, keyFile string) (tls.Certificate, error) {
	n := 0
	for rest := certPEM; ; {
		var b *pem.Block
		if b, rest = pem.Decode(rest); b == nil {
			break
		}
		if b.Type != "CERTIFICATE" {
			continue
		}
		if _, err := x509.ParseCertificate(b.Bytes); err != nil {
			return tls.Certificate{}, &KeyPairError{Path: certFile, Err: fmt.Errorf("certificate %d: %w", n+1, err)}
		}
		n++
	}
	if n == 0 {
		return tls.Certificate{}, &KeyPairError{Path: certFile, Err: errNoCertificate}
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return tls.Certificate{}, &KeyPairError{Key: true, Path: keyFile, Err: err}
	}
	return cert, nil
}
