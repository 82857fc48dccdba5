package picker_test

import (
	"context"
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
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/internal/testca"
	"github.com/examlops/gateway/keys"
	"github.com/examlops/gateway/picker"
	"github.com/examlops/gateway/picker/pickertest"
)

// testCA is a certificate authority made for one test.
type testCA struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	pem  []byte
}

func newCA(t *testing.T, name string) *testCA {
	t.Helper()
	c := testca.New(t, name)
	return &testCA{cert: c.Cert, key: c.Key, pem: c.PEM}
}

func (ca *testCA) pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.cert)
	return p
}

// issue returns the PEM of a server certificate for host "picker.test",
// followed by the CA's own (a chain, as cert-manager writes tls.crt), and
// of its key.
func (ca *testCA) issue(t *testing.T) (certPEM, keyPEM []byte) {
	t.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(2), Subject: pkix.Name{CommonName: "picker.test"},
		DNSNames: []string{"picker.test"}, NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		t.Fatal(err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		t.Fatal(err)
	}
	certPEM = append(pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}), ca.pem...)
	return certPEM, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder})
}

func writeFile(t *testing.T, path string, b []byte) {
	t.Helper()
	if err := os.WriteFile(path, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// startTLSPicker serves a picker (one replica, 10.0.0.1:8000) over TLS
// with the certificates get returns, on an in-process listener, and
// returns a dialer to it.
func startTLSPicker(t *testing.T, get func(*tls.ClientHelloInfo) (*tls.Certificate, error)) func(credentials.TransportCredentials) *grpc.ClientConn {
	t.Helper()
	return startPickerTLS(t, picker.TLSConfig(get))
}

// startPickerTLS is startTLSPicker with the server's whole TLS config.
func startPickerTLS(t *testing.T, cfg *tls.Config) func(credentials.TransportCredentials) *grpc.ClientConn {
	t.Helper()
	gw, err := gateway.New([]gateway.Replica{{Name: "r0", Address: "http://10.0.0.1:8000"}}, gateway.WithMode(gateway.ModeCacheAware))
	if err != nil {
		t.Fatal(err)
	}
	key, err := picker.BodyKey(keys.TextBlockBytes, "m1")
	if err != nil {
		t.Fatal(err)
	}
	router, err := picker.NewGatewayRouter(gw, key, 0)
	if err != nil {
		t.Fatal(err)
	}
	srv, err := picker.New(router, picker.Options{})
	if err != nil {
		t.Fatal(err)
	}
	lis := bufconn.Listen(1 << 20)
	g := grpc.NewServer(grpc.Creds(credentials.NewTLS(cfg)))
	srv.Register(g)
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
	return func(creds credentials.TransportCredentials) *grpc.ClientConn {
		conn, err := grpc.NewClient("passthrough:///bufnet",
			grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return lis.DialContext(ctx) }),
			grpc.WithTransportCredentials(creds))
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { conn.Close() })
		return conn
	}
}

// exchange plays one whole request over conn, as Envoy would, and returns
// the endpoint picked or the error.
func exchange(conn *grpc.ClientConn) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	x, err := pickertest.NewClient(conn).Open(ctx)
	if err != nil {
		return "", err
	}
	r, err := x.Request(pickertest.Request{Body: []byte(`{"model":"m1","messages":[{"role":"user","content":"hello over TLS"}]}`)})
	if err != nil {
		return "", err
	}
	if r.Immediate != nil {
		return "", errors.New("immediate response: " + r.Immediate.String())
	}
	if _, err := x.Respond(200, "application/json", []byte(`{"choices":[]}`)); err != nil {
		return "", err
	}
	return r.Endpoint, x.Close()
}

func clientTLS(roots *x509.CertPool, serverName string) credentials.TransportCredentials {
	return credentials.NewTLS(&tls.Config{RootCAs: roots, ServerName: serverName})
}

// A client verifying the picker's certificate (issued by a CA, read from
// files) completes an ext_proc exchange; a plaintext client is refused.
func TestTLSKeyPairExchange(t *testing.T) {
	dir := t.TempDir()
	ca := newCA(t, "ca")
	c, k := ca.issue(t)
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	writeFile(t, certFile, c)
	writeFile(t, keyFile, k)
	kp, err := picker.LoadKeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	if n := len(kp.Certificate().Certificate); n != 2 {
		t.Fatalf("chain of %d certificates, want leaf and CA", n)
	}
	dial := startTLSPicker(t, kp.GetCertificate)

	ep, err := exchange(dial(clientTLS(ca.pool(), "picker.test")))
	if err != nil || ep != "10.0.0.1:8000" {
		t.Fatalf("TLS exchange: endpoint %q, err %v; want 10.0.0.1:8000", ep, err)
	}
	_, err = exchange(dial(insecure.NewCredentials()))
	if status.Code(err) != codes.Unavailable {
		t.Fatalf("plaintext client: err %v, want Unavailable", err)
	}
	_, err = exchange(dial(clientTLS(ca.pool(), "other.test")))
	if status.Code(err) != codes.Unavailable || !strings.Contains(err.Error(), "certificate") {
		t.Fatalf("client expecting another name: err %v, want a certificate error", err)
	}
}

// A self-signed certificate serves clients that trust it (or, as Envoy
// is configured for GIE's picker, verify nothing).
func TestTLSSelfSigned(t *testing.T) {
	now := time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC)
	cert, err := picker.SelfSigned([]string{"localhost", "127.0.0.1", ""}, now)
	if err != nil {
		t.Fatal(err)
	}
	leaf := cert.Leaf
	if got := leaf.NotAfter.Sub(now); got != picker.SelfSignedValidity {
		t.Errorf("valid for %v after now, want %v", got, picker.SelfSignedValidity)
	}
	if !leaf.NotBefore.Before(now) {
		t.Errorf("NotBefore %v not before now %v", leaf.NotBefore, now)
	}
	if len(leaf.DNSNames) != 1 || leaf.DNSNames[0] != "localhost" || len(leaf.IPAddresses) != 1 || !leaf.IPAddresses[0].Equal(net.IPv4(127, 0, 0, 1)) {
		t.Errorf("SANs %v %v, want localhost and 127.0.0.1", leaf.DNSNames, leaf.IPAddresses)
	}
	// The test's clock is not the handshake's: serve one made now.
	cert, err = picker.SelfSigned([]string{"localhost"}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	dial := startTLSPicker(t, func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return &cert, nil })
	roots := x509.NewCertPool()
	roots.AddCert(cert.Leaf)
	if ep, err := exchange(dial(clientTLS(roots, "localhost"))); err != nil || ep != "10.0.0.1:8000" {
		t.Fatalf("client trusting the certificate: endpoint %q, err %v", ep, err)
	}
	if ep, err := exchange(dial(credentials.NewTLS(&tls.Config{InsecureSkipVerify: true}))); err != nil || ep != "10.0.0.1:8000" {
		t.Fatalf("client verifying nothing: endpoint %q, err %v", ep, err)
	}
	if _, err := exchange(dial(clientTLS(x509.NewCertPool(), "localhost"))); status.Code(err) != codes.Unavailable {
		t.Fatalf("client verifying against no roots: err %v, want Unavailable", err)
	}
	if _, err := exchange(dial(insecure.NewCredentials())); status.Code(err) != codes.Unavailable {
		t.Fatalf("plaintext client: err %v, want Unavailable", err)
	}
}

// Reload serves new files to new connections, keeps the pair when the
// files did not change, and keeps serving the last good pair when the new
// files do not make one.
func TestKeyPairReload(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	caA, caB := newCA(t, "ca-a"), newCA(t, "ca-b")
	cA, kA := caA.issue(t)
	writeFile(t, certFile, cA)
	writeFile(t, keyFile, kA)
	kp, err := picker.LoadKeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	dial := startTLSPicker(t, kp.GetCertificate)
	trustsA, trustsB := clientTLS(caA.pool(), "picker.test"), clientTLS(caB.pool(), "picker.test")
	serves := func(creds credentials.TransportCredentials) bool {
		_, err := exchange(dial(creds))
		return err == nil
	}
	if !serves(trustsA) || serves(trustsB) {
		t.Fatal("before reload: want A's certificate served")
	}
	if changed, err := kp.Reload(); changed || err != nil {
		t.Fatalf("Reload of unchanged files = %v, %v; want false, nil", changed, err)
	}

	cB, kB := caB.issue(t)
	writeFile(t, certFile, cB) // the certificate first: a pair that does not match
	changed, err := kp.Reload()
	var kpe *picker.KeyPairError
	if changed || !errors.As(err, &kpe) || !kpe.Key || kpe.Path != keyFile {
		t.Fatalf("Reload of a mismatched pair = %v, %v; want a KeyPairError on the key file", changed, err)
	}
	if !serves(trustsA) {
		t.Fatal("after a failed reload: want A's certificate still served")
	}
	writeFile(t, keyFile, kB)
	if changed, err := kp.Reload(); !changed || err != nil {
		t.Fatalf("Reload of B = %v, %v; want true, nil", changed, err)
	}
	if serves(trustsA) || !serves(trustsB) {
		t.Fatal("after reload: want B's certificate served")
	}
	if err := os.Remove(certFile); err != nil {
		t.Fatal(err)
	}
	if _, err := kp.Reload(); !errors.As(err, &kpe) || kpe.Key || !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("Reload without the certificate file: %v; want a KeyPairError on the certificate file", err)
	}
	if !serves(trustsB) {
		t.Fatal("after the file went away: want B's certificate still served")
	}
}

// LoadKeyPair names the file at fault.
func TestLoadKeyPairErrors(t *testing.T) {
	dir := t.TempDir()
	ca := newCA(t, "ca")
	c1, k1 := ca.issue(t)
	_, k2 := ca.issue(t)
	files := map[string][]byte{"cert": c1, "key": k1, "otherkey": k2, "empty": nil, "garbage": []byte("not PEM at all\n"),
		"badcert": pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte("not DER")})}
	for name, b := range files {
		writeFile(t, filepath.Join(dir, name), b)
	}
	for _, tt := range []struct {
		cert, key  string
		keyAtFault bool
		want       string
	}{
		{"missing", "key", false, "no such file"},
		{"cert", "missing", true, "no such file"},
		{"empty", "key", false, "no PEM CERTIFICATE block"},
		{"garbage", "key", false, "no PEM CERTIFICATE block"},
		{"key", "cert", false, "no PEM CERTIFICATE block"}, // swapped
		{"badcert", "key", false, "certificate 1:"},
		{"cert", "otherkey", true, "private key does not match public key"},
		{"cert", "garbage", true, "failed to find any PEM data in key input"},
		{"cert", "cert", true, `"PRIVATE KEY" in key input`},
	} {
		t.Run(tt.cert+","+tt.key, func(t *testing.T) {
			cf, kf := filepath.Join(dir, tt.cert), filepath.Join(dir, tt.key)
			kp, err := picker.LoadKeyPair(cf, kf)
			var kpe *picker.KeyPairError
			if kp != nil || !errors.As(err, &kpe) {
				t.Fatalf("LoadKeyPair = %v, %v; want a KeyPairError", kp, err)
			}
			wantPath := cf
			if tt.keyAtFault {
				wantPath = kf
			}
			if kpe.Key != tt.keyAtFault || kpe.Path != wantPath || !strings.Contains(err.Error(), tt.want) || !strings.Contains(err.Error(), wantPath) {
				t.Fatalf("error %q (key at fault %v, path %q); want key at fault %v, path %q, %q", err, kpe.Key, kpe.Path, tt.keyAtFault, wantPath, tt.want)
			}
		})
	}
}

// GetCertificate during reloads always returns a whole pair, one of those
// written (run under -race).
func TestKeyPairConcurrentReload(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	ca := newCA(t, "ca")
	var pairs [2][2][]byte
	for i := range pairs {
		pairs[i][0], pairs[i][1] = ca.issue(t)
	}
	writeFile(t, certFile, pairs[0][0])
	writeFile(t, keyFile, pairs[0][1])
	kp, err := picker.LoadKeyPair(certFile, keyFile)
	if err != nil {
		t.Fatal(err)
	}
	leaves := map[string]bool{}
	for _, p := range pairs {
		b, _ := pem.Decode(p[0])
		leaves[string(b.Bytes)] = true
	}
	stop := make(chan struct{})
	errs := make(chan error, 4)
	for range 4 {
		go func() {
			for {
				select {
				case <-stop:
					errs <- nil
					return
				default:
				}
				c, err := kp.GetCertificate(nil)
				if err != nil || c == nil || !leaves[string(c.Certificate[0])] || c.PrivateKey == nil {
					errs <- errors.New("GetCertificate returned no pair written")
					return
				}
			}
		}()
	}
	for i := range 20 {
		p := pairs[(i+1)%2]
		writeFile(t, certFile, p[0])
		writeFile(t, keyFile, p[1])
		if changed, err := kp.Reload(); !changed || err != nil {
			t.Fatalf("reload %d = %v, %v", i, changed, err)
		}
	}
	close(stop)
	for range 4 {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
}
