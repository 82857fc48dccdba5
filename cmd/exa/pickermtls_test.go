package main

import (
	"bytes"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"log/slog"
	"math/big"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/examlops/gateway/picker"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/credentials"
)

// mtlsCA is a certificate authority made for one test.
type mtlsCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newMTLSCA(t *testing.T, name string) *mtlsCA {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: name},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(t, err)
	cert, err := x509.ParseCertificate(der)
	require.NoError(t, err)
	return &mtlsCA{cert: cert, key: key, pem: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}
}

// client returns a client certificate (clientAuth) signed by ca, naming
// uri as a URI SAN when it is not empty ("dns=NAME": NAME as a DNS SAN).
func (ca *mtlsCA) client(t *testing.T, uri string) tls.Certificate {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(t, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "envoy"},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}}
	if dns, ok := strings.CutPrefix(uri, "dns="); ok {
		tmpl.DNSNames = []string{dns}
	} else if uri != "" {
		u, err := url.Parse(uri)
		require.NoError(t, err)
		tmpl.URIs = []*url.URL{u}
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	require.NoError(t, err)
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}
}

// TestPickerBadClientCAFlags: bad mutual TLS flags and CA files are
// one-line usage errors (exit 2) naming the flag and its value.
func TestPickerBadClientCAFlags(t *testing.T) {
	dir := t.TempDir()
	certA, keyA, _ := writePair(t, dir, "a")
	ca := filepath.Join(dir, "ca.crt")
	require.NoError(t, os.WriteFile(ca, newMTLSCA(t, "ca").pem, 0o600))
	empty := filepath.Join(dir, "empty.pem")
	require.NoError(t, os.WriteFile(empty, nil, 0o600))
	missing := filepath.Join(dir, "missing.pem")
	tlsArgs := []string{"--tls-cert", certA, "--tls-key", keyA}
	for _, tt := range []struct {
		name string
		args []string
		want string
	}{
		{"no TLS", []string{"--tls-client-ca", ca},
			`invalid --tls-client-ca "` + ca + `": needs TLS: --tls-cert and --tls-key, or --tls-self-signed (--secure-serving in GIE mode)`},
		{"GIE plaintext", []string{"--secure-serving=false", "--tls-client-ca", ca},
			`invalid --tls-client-ca "` + ca + `": needs TLS: --tls-cert and --tls-key, or --tls-self-signed (--secure-serving in GIE mode)`},
		{"empty name", append([]string{"--tls-client-ca", ""}, tlsArgs...), `invalid --tls-client-ca "": must name a PEM file`},
		{"missing file", append([]string{"--tls-client-ca", missing}, tlsArgs...),
			`invalid --tls-client-ca "` + missing + `": open ` + missing + `: no such file or directory`},
		{"no certificate", append([]string{"--tls-client-ca", empty}, tlsArgs...),
			`invalid --tls-client-ca "` + empty + `": no PEM CERTIFICATE block in it`},
		{"key as CA", append([]string{"--tls-client-ca", keyA}, tlsArgs...),
			`invalid --tls-client-ca "` + keyA + `": PEM block 1 is a "PRIVATE KEY", not a CERTIFICATE`},
		{"SAN without CA", append([]string{"--tls-client-san", "envoy"}, tlsArgs...),
			`invalid --tls-client-san "envoy": needs --tls-client-ca, the CAs that issue client certificates`},
		{"empty SAN", append([]string{"--tls-client-ca", ca, "--tls-client-san", ""}, tlsArgs...),
			`invalid --tls-client-san "": want a DNS name, a URI such as spiffe://cluster.local/ns/gw/sa/envoy, an IP or an email address`},
		{"SAN with space", append([]string{"--tls-client-ca", ca, "--tls-client-san", "a b"}, tlsArgs...),
			`invalid --tls-client-san "a b": want a DNS name, a URI such as spiffe://cluster.local/ns/gw/sa/envoy, an IP or an email address`},
		{"SAN not canonical", append([]string{"--tls-client-ca", ca, "--tls-client-san", "SPIFFE://td/envoy"}, tlsArgs...),
			`invalid --tls-client-san "SPIFFE://td/envoy": want a URI in the form Go compares it, "spiffe://td/envoy"`},
	} {
		t.Run(tt.name, func(t *testing.T) {
			args := append([]string{"serve", "picker", "--listen", "127.0.0.1:0", "--admin-listen", "127.0.0.1:0"}, tt.args...)
			r := exa(t, newConfig(t), args...)
			assert.Equal(t, 2, r.code, "stderr: %s", r.stderr)
			assert.Equal(t, "exa: "+tt.want+"\n", r.stderr)
			assert.Empty(t, r.stdout, "nothing served")
		})
	}
}

// The binary with --tls-client-ca serves only clients presenting a
// certificate from the CA (and naming the --tls-client-san); with
// --tls-self-signed and GIE's --secure-serving too.
func TestPickerServesMutualTLS(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile, cert := writePair(t, dir, "tls")
	roots := x509.NewCertPool()
	roots.AddCert(cert.Leaf)
	ca, other := newMTLSCA(t, "client-ca"), newMTLSCA(t, "other-ca")
	caFile := filepath.Join(dir, "client-ca.crt")
	require.NoError(t, os.WriteFile(caFile, ca.pem, 0o600))
	spiffe := "spiffe://cluster.local/ns/gw/sa/envoy"
	client := func(c tls.Certificate, verify bool) credentials.TransportCredentials {
		cfg := &tls.Config{RootCAs: roots, ServerName: "localhost", InsecureSkipVerify: !verify,
			GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &c, nil }}
		return credentials.NewTLS(cfg)
	}

	addr, line := startPickerBin(t, "--tls-cert", certFile, "--tls-key", keyFile, "--tls-client-ca", caFile, "--tls-client-san", spiffe)
	assert.Contains(t, line, "(ext_proc gRPC, TLS, certificate "+certFile+", client certificates required from CA file "+caFile+" naming "+spiffe+")")
	require.NoError(t, healthCheck(t, addr, client(ca.client(t, spiffe), true)))
	require.Error(t, healthCheck(t, addr, client(tls.Certificate{}, true)), "no client certificate")
	require.Error(t, healthCheck(t, addr, client(other.client(t, spiffe), true)), "certificate from another CA")
	require.Error(t, healthCheck(t, addr, client(ca.client(t, "spiffe://cluster.local/ns/x/sa/rogue"), true)), "another SAN")
	require.Error(t, healthCheck(t, addr, client(ca.client(t, "dns="+spiffe), true)), "the SPIFFE ID as a DNS SAN")

	addr, line = startPickerBin(t, "--tls-self-signed", "--tls-client-ca", caFile)
	assert.Contains(t, line, ", client certificates required from CA file "+caFile+")")
	require.NoError(t, healthCheck(t, addr, client(ca.client(t, ""), false)))
	require.Error(t, healthCheck(t, addr, client(tls.Certificate{}, false)), "no client certificate")

	// As the Helm chart runs it: GIE's --secure-serving (self-signed).
	addr, line = startPickerBin(t, "--secure-serving=true", "--tls-client-ca="+caFile, "--tls-client-san="+spiffe)
	assert.Contains(t, line, "self-signed certificate sha256 ")
	require.NoError(t, healthCheck(t, addr, client(ca.client(t, spiffe), false)))
	require.Error(t, healthCheck(t, addr, client(ca.client(t, ""), false)), "no SAN")
}

// clientCAWatcher reloads a changed file, logs a failed reload once naming
// the file and keeps the previous CAs; watchClientCAs reloads at each tick.
func TestWatchClientCAs(t *testing.T) {
	dir := t.TempDir()
	a, b := newMTLSCA(t, "a"), newMTLSCA(t, "b")
	caFile := filepath.Join(dir, "client-ca.crt")
	require.NoError(t, os.WriteFile(caFile, a.pem, 0o600))
	cas, err := picker.LoadClientCAs(caFile)
	require.NoError(t, err)
	pool := cas.Pool()
	var logs bytes.Buffer
	w := &clientCAWatcher{cas: cas, file: caFile, logger: slog.New(slog.NewTextHandler(&logs, nil))}

	w.reload()
	assert.Same(t, pool, cas.Pool(), "unchanged file")
	assert.Empty(t, logs.String())

	require.NoError(t, os.WriteFile(caFile, []byte("-----BEGIN CERTIFICATE-----\nMAA=\n-----END CERTIFICATE-----\n"), 0o600))
	w.reload()
	w.reload()
	assert.Same(t, pool, cas.Pool(), "a bad file keeps the CAs")
	assert.Equal(t, 1, strings.Count(logs.String(), "TLS client CA file not reloaded"), "logged once: %s", logs.String())
	assert.Contains(t, logs.String(), "file="+caFile)
	assert.Contains(t, logs.String(), "certificate 1: x509:")

	// The loop: one tick reloads the rotated file (B), then it ends with ctx.
	require.NoError(t, os.WriteFile(caFile, b.pem, 0o600))
	ctx, cancel := context.WithCancel(context.Background())
	tick := make(chan time.Time) // unbuffered: the send returns once the loop has the tick
	done := make(chan struct{})
	go func() { watchClientCAs(ctx, cas, caFile, tick, w.logger); close(done) }()
	assert.Same(t, pool, cas.Pool(), "not before the tick")
	tick <- time.Time{}
	cancel()
	<-done
	require.NotSame(t, pool, cas.Pool(), "reloaded at the tick")
	leafB, err := x509.ParseCertificate(b.client(t, "").Certificate[0])
	require.NoError(t, err)
	_, err = leafB.Verify(x509.VerifyOptions{Roots: cas.Pool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	require.NoError(t, err, "a client certificate of B verifies against the pool in use")
	leafA, err := x509.ParseCertificate(a.client(t, "").Certificate[0])
	require.NoError(t, err)
	_, err = leafA.Verify(x509.VerifyOptions{Roots: cas.Pool(), KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}})
	require.Error(t, err, "A's no longer does")
	assert.Contains(t, logs.String(), "TLS client CA file reloaded")
}
