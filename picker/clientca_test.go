package picker_test

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"math/big"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/status"

	"github.com/examlops/gateway/picker"
)

// clientCert is what issueClient puts in a client certificate.
type clientCert struct {
	notAfter time.Time        // zero: an hour from now
	eku      x509.ExtKeyUsage // zero (ExtKeyUsageAny) means clientAuth
	dns      []string         // DNS SANs
	uris     []string         // URI SANs
	ips      []string         // IP SANs
	emails   []string         // email SANs
}

// issueClient returns a client certificate signed by ca.
func (ca *testCA) issueClient(t *testing.T, cc clientCert) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	notAfter := cc.notAfter
	if notAfter.IsZero() {
		notAfter = time.Now().Add(time.Hour)
	}
	eku := cc.eku
	if eku == x509.ExtKeyUsageAny {
		eku = x509.ExtKeyUsageClientAuth
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(3), Subject: pkix.Name{CommonName: "envoy"},
		DNSNames: cc.dns, EmailAddresses: cc.emails, NotBefore: notAfter.Add(-2 * time.Hour), NotAfter: notAfter,
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{eku}}
	for _, s := range cc.uris {
		u, err := url.Parse(s)
		if err != nil {
			t.Fatal(err)
		}
		tmpl.URIs = append(tmpl.URIs, u)
	}
	for _, s := range cc.ips {
		tmpl.IPAddresses = append(tmpl.IPAddresses, net.ParseIP(s))
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// mtlsServer is a TLS listener on loopback that reports the outcome of
// each server-side handshake.
type mtlsServer struct {
	addr    string
	results chan error
	roots   *x509.CertPool
}

// startMTLS listens on 127.0.0.1 with cfg and handshakes every connection.
func startMTLS(t *testing.T, cfg *tls.Config, roots *x509.CertPool) *mtlsServer {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &mtlsServer{addr: ln.Addr().String(), results: make(chan error, 16), roots: roots}
	var wg sync.WaitGroup
	t.Cleanup(func() { ln.Close(); wg.Wait() })
	wg.Add(1)
	go func() {
		defer wg.Done()
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			tc := tls.Server(c, cfg)
			err = tc.Handshake()
			if err == nil {
				_, err = tc.Write([]byte("ok")) // the client reads it: handshake accepted
			}
			tc.Close()
			s.results <- err
		}
	}()
	return s
}

// dial handshakes as a client presenting certs[0] (none when empty) and
// returns the server's verdict on the handshake.
func (s *mtlsServer) dial(t *testing.T, certs ...tls.Certificate) error {
	t.Helper()
	cfg := &tls.Config{RootCAs: s.roots, ServerName: "picker.test", NextProtos: []string{"h2"}}
	if len(certs) > 0 {
		// Present it whatever CAs the server names, as Envoy does (Go's
		// client would otherwise send none that the server cannot verify).
		cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &certs[0], nil }
	}
	c, err := tls.Dial("tcp", s.addr, cfg)
	if err == nil {
		buf := make([]byte, 2)
		_, err = c.Read(buf) // in TLS 1.3 a refused client certificate shows here
		c.Close()
		if err == nil && string(buf) != "ok" {
			err = errors.New("unexpected reply " + string(buf))
		}
	}
	srvErr := <-s.results
	if (err == nil) != (srvErr == nil) {
		t.Fatalf("client saw %v, server saw %v", err, srvErr)
	}
	return srvErr
}

// serverPair is a server key pair from srvCA, as the picker serves it.
func serverPair(t *testing.T, srvCA *testCA) *tls.Certificate {
	t.Helper()
	c, k := srvCA.issue(t)
	cert, err := tls.X509KeyPair(c, k)
	if err != nil {
		t.Fatal(err)
	}
	return &cert
}

// A client certificate from the client CA is accepted; no certificate, one
// from another CA, an expired one or one not for client authentication is
// refused in the handshake.
func TestMutualTLSHandshake(t *testing.T) {
	dir := t.TempDir()
	srvCA, clientCA, otherCA := newCA(t, "server-ca"), newCA(t, "client-ca"), newCA(t, "other-ca")
	caFile := filepath.Join(dir, "client-ca.crt")
	writeFile(t, caFile, clientCA.pem)
	cas, err := picker.LoadClientCAs(caFile)
	if err != nil {
		t.Fatal(err)
	}
	if cas.Len() != 1 {
		t.Fatalf("Len %d, want 1", cas.Len())
	}
	pair := serverPair(t, srvCA)
	get := func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return pair, nil }
	srv := startMTLS(t, picker.MutualTLSConfig(get, cas, nil), srvCA.pool())

	if err := srv.dial(t, clientCA.issueClient(t, clientCert{})); err != nil {
		t.Fatalf("client certificate from the client CA: %v", err)
	}
	for _, tt := range []struct {
		name  string
		certs []tls.Certificate
		want  string
	}{
		{"no certificate", nil, "didn't provide a certificate"},
		{"another CA", []tls.Certificate{otherCA.issueClient(t, clientCert{})}, "certificate signed by unknown authority"},
		{"expired", []tls.Certificate{clientCA.issueClient(t, clientCert{notAfter: time.Now().Add(-time.Minute)})}, "expired"},
		{"server auth only", []tls.Certificate{clientCA.issueClient(t, clientCert{eku: x509.ExtKeyUsageServerAuth})}, "incompatible key usage"},
	} {
		err := srv.dial(t, tt.certs...)
		if err == nil || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: server handshake error %v, want one containing %q", tt.name, err, tt.want)
		}
	}
}

// A self-signed client certificate (not a CA) in the bundle is trusted
// itself: it pins that one client.
func TestMutualTLSPinned(t *testing.T) {
	srvCA := newCA(t, "server-ca")
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(9), Subject: pkix.Name{CommonName: "envoy"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour), KeyUsage: x509.KeyUsageDigitalSignature}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatal(err)
	}
	caFile := filepath.Join(t.TempDir(), "pinned.crt")
	writeFile(t, caFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}))
	cas, err := picker.LoadClientCAs(caFile)
	if err != nil {
		t.Fatal(err)
	}
	pair := serverPair(t, srvCA)
	srv := startMTLS(t, picker.MutualTLSConfig(func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return pair, nil }, cas, nil), srvCA.pool())
	if err := srv.dial(t, tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}); err != nil {
		t.Fatalf("pinned certificate: %v", err)
	}
	if err := srv.dial(t, newCA(t, "other").issueClient(t, clientCert{})); err == nil {
		t.Fatal("another client accepted")
	}
}

// With allowed SANs, a certificate from the CA must also name one of them
// (DNS or URI, exact).
func TestMutualTLSSANs(t *testing.T) {
	dir := t.TempDir()
	srvCA, clientCA := newCA(t, "server-ca"), newCA(t, "client-ca")
	caFile := filepath.Join(dir, "client-ca.crt")
	writeFile(t, caFile, clientCA.pem)
	cas, err := picker.LoadClientCAs(caFile)
	if err != nil {
		t.Fatal(err)
	}
	pair := serverPair(t, srvCA)
	get := func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return pair, nil }
	spiffe := "spiffe://cluster.local/ns/gw/sa/envoy"
	srv := startMTLS(t, picker.MutualTLSConfig(get, cas, []string{spiffe, "envoy.gw.svc", "10.0.0.7", "fd00::7", "envoy@gw.example"}), srvCA.pool())

	// Each allowed name passes as a SAN of its own form.
	for _, cc := range []clientCert{{uris: []string{spiffe}}, {dns: []string{"other", "envoy.gw.svc"}}, {dns: []string{"Envoy.GW.svc"}},
		{ips: []string{"10.0.0.7"}}, {ips: []string{"fd00::7"}}, {emails: []string{"envoy@gw.example"}}} {
		if err := srv.dial(t, clientCA.issueClient(t, cc)); err != nil {
			t.Errorf("SANs %+v: %v", cc, err)
		}
	}
	// A name spelled in a SAN of another form does not: a DNS SAN that
	// spells the SPIFFE ID, the IP or the email address, a URI SAN that
	// spells the DNS name's form.
	for _, cc := range []clientCert{{}, {uris: []string{spiffe + "-not"}}, {dns: []string{"envoy.gw.svc.evil"}},
		{dns: []string{spiffe}}, {dns: []string{"10.0.0.7"}}, {dns: []string{"envoy@gw.example"}},
		{uris: []string{"dns:envoy.gw.svc"}}, {ips: []string{"10.0.0.8"}}, {emails: []string{"other@gw.example"}}} {
		err := srv.dial(t, clientCA.issueClient(t, cc))
		if err == nil || !strings.Contains(err.Error(), "none of the allowed SANs") {
			t.Errorf("SANs %+v: err %v, want refused", cc, err)
		}
	}
}

// A rotated CA file is used after Reload, not before; a bad file keeps
// the pool in use.
func TestClientCAsReload(t *testing.T) {
	dir := t.TempDir()
	srvCA, a, b := newCA(t, "server-ca"), newCA(t, "ca-a"), newCA(t, "ca-b")
	caFile := filepath.Join(dir, "client-ca.crt")
	writeFile(t, caFile, a.pem)
	cas, err := picker.LoadClientCAs(caFile)
	if err != nil {
		t.Fatal(err)
	}
	pair := serverPair(t, srvCA)
	get := func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return pair, nil }
	srv := startMTLS(t, picker.MutualTLSConfig(get, cas, nil), srvCA.pool())
	certA, certB := a.issueClient(t, clientCert{}), b.issueClient(t, clientCert{})

	if changed, err := cas.Reload(); changed || err != nil {
		t.Fatalf("unchanged file: changed %v, err %v", changed, err)
	}
	writeFile(t, caFile, b.pem)
	if err := srv.dial(t, certA); err != nil {
		t.Fatalf("before Reload, CA A still trusted: %v", err)
	}
	if changed, err := cas.Reload(); !changed || err != nil {
		t.Fatalf("rotated file: changed %v, err %v", changed, err)
	}
	if err := srv.dial(t, certB); err != nil {
		t.Fatalf("after Reload, CA B trusted: %v", err)
	}
	if err := srv.dial(t, certA); err == nil {
		t.Fatal("after Reload, CA A still trusted")
	}

	// A bundle of both; then a bad file, which keeps the bundle.
	writeFile(t, caFile, append(append([]byte("# bundle\n"), a.pem...), b.pem...))
	if changed, err := cas.Reload(); !changed || err != nil || cas.Len() != 2 {
		t.Fatalf("bundle: changed %v, err %v, Len %d", changed, err, cas.Len())
	}
	writeFile(t, caFile, []byte("not PEM"))
	_, err = cas.Reload()
	var cae *picker.ClientCAError
	if !errors.As(err, &cae) || cae.Path != caFile || !strings.Contains(err.Error(), "no PEM CERTIFICATE block") {
		t.Fatalf("bad file: err %v, want a ClientCAError naming %s", err, caFile)
	}
	for _, c := range []tls.Certificate{certA, certB} {
		if err := srv.dial(t, c); err != nil {
			t.Fatalf("after a failed Reload the bundle stays: %v", err)
		}
	}
}

// LoadClientCAs names the file and what is wrong with it.
func TestLoadClientCAsErrors(t *testing.T) {
	dir := t.TempDir()
	ca := newCA(t, "ca")
	_, keyPEM := ca.issue(t)
	for _, tt := range []struct {
		name, content, want string
	}{
		{"empty", "", "no PEM CERTIFICATE block in it"},
		{"text", "hello", "no PEM CERTIFICATE block in it"},
		{"key", string(keyPEM), `PEM block 1 is a "PRIVATE KEY", not a CERTIFICATE`},
		{"cert then key", string(ca.pem) + string(keyPEM), `PEM block 2 is a "PRIVATE KEY", not a CERTIFICATE`},
		{"bad DER", "-----BEGIN CERTIFICATE-----\nMAA=\n-----END CERTIFICATE-----\n", "certificate 1: x509:"},
	} {
		f := filepath.Join(dir, tt.name+".pem")
		writeFile(t, f, []byte(tt.content))
		_, err := picker.LoadClientCAs(f)
		var cae *picker.ClientCAError
		if !errors.As(err, &cae) || cae.Path != f || !strings.Contains(err.Error(), tt.want) {
			t.Errorf("%s: err %v, want a ClientCAError naming %s with %q", tt.name, err, f, tt.want)
		}
	}
	missing := filepath.Join(dir, "missing.pem")
	if _, err := picker.LoadClientCAs(missing); !errors.Is(err, os.ErrNotExist) {
		t.Errorf("missing file: err %v", err)
	}
}

// Handshakes run while the CA file is rotated and reloaded (run with
// -race): every handshake is verified against one pool or the other.
func TestClientCAsConcurrentReload(t *testing.T) {
	dir := t.TempDir()
	srvCA, a, b := newCA(t, "server-ca"), newCA(t, "ca-a"), newCA(t, "ca-b")
	caFile := filepath.Join(dir, "client-ca.crt")
	writeFile(t, caFile, append(append([]byte{}, a.pem...), b.pem...))
	cas, err := picker.LoadClientCAs(caFile)
	if err != nil {
		t.Fatal(err)
	}
	pair := serverPair(t, srvCA)
	cfg := picker.MutualTLSConfig(func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return pair, nil }, cas, nil)
	certA := a.issueClient(t, clientCert{})
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for i := range 20 {
			pemb := a.pem
			if i%2 == 0 {
				pemb = append(append([]byte{}, a.pem...), b.pem...)
			}
			writeFile(t, caFile, pemb)
			if _, err := cas.Reload(); err != nil {
				t.Error(err)
			}
		}
	}()
	srv := startMTLS(t, cfg, srvCA.pool())
	for range 10 {
		if err := srv.dial(t, certA); err != nil {
			t.Errorf("handshake with CA A, in both pools: %v", err)
		}
	}
	wg.Wait()
}

// A whole ext_proc exchange over mutual TLS: Envoy's client certificate
// is accepted; a client with none gets Unavailable.
func TestMutualTLSExchange(t *testing.T) {
	dir := t.TempDir()
	srvCA, clientCA := newCA(t, "server-ca"), newCA(t, "client-ca")
	caFile := filepath.Join(dir, "client-ca.crt")
	writeFile(t, caFile, clientCA.pem)
	cas, err := picker.LoadClientCAs(caFile)
	if err != nil {
		t.Fatal(err)
	}
	pair := serverPair(t, srvCA)
	dial := startPickerTLS(t, picker.MutualTLSConfig(func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return pair, nil }, cas, nil))
	envoy := credentials.NewTLS(&tls.Config{RootCAs: srvCA.pool(), ServerName: "picker.test",
		Certificates: []tls.Certificate{clientCA.issueClient(t, clientCert{})}})
	ep, err := exchange(dial(envoy))
	if err != nil || ep != "10.0.0.1:8000" {
		t.Fatalf("mutual TLS exchange: endpoint %q, err %v", ep, err)
	}
	_, err = exchange(dial(clientTLS(srvCA.pool(), "picker.test")))
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("client without a certificate: err %v, want Unavailable", err)
	}
}
