package main

import (
	"bufio"
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/examlops/gateway/httpgw"
	"github.com/examlops/gateway/httpgw/enginetest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// startGatewayTLS starts `exa serve gateway` with args and returns its
// https:// base URL.
func startGatewayTLS(t *testing.T, cfg string, args ...string) string {
	t.Helper()
	all := append([]string{"serve", "gateway", "--listen", "127.0.0.1:0"}, args...)
	base, _, _, _ := startExa(t, exaBin, cfg, `gateway listening on (https://\S+) `, all...)
	return base
}

// tlsClient trusts roots (nil: none, it skips verification) and presents
// certs.
func tlsClient(roots *x509.CertPool, certs ...tls.Certificate) *http.Client {
	return &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		TLSClientConfig:   &tls.Config{RootCAs: roots, ServerName: "localhost", Certificates: certs, InsecureSkipVerify: roots == nil},
		DisableKeepAlives: true}}
}

// TestGatewayServesTLS: with --tls-cert and --tls-key the gateway serves
// HTTPS with that pair, both front servers: a chat request reaches the
// engine; ALPN settles on HTTP/1.1 when a client offers h2 too; a plain
// HTTP request gets no answer of the gateway's; and a new pair written to
// the files is served to new connections after --reload-interval.
func TestGatewayServesTLS(t *testing.T) {
	for _, server := range []string{"lean", "std"} {
		t.Run(server, func(t *testing.T) {
			e := enginetest.New(enginetest.Options{Name: "e0", Model: "m"})
			t.Cleanup(e.Close)
			cfg := newConfig(t)
			ok(t, cfg, "serve", "routing", "set", "m", "--mode", "cache_aware", "--replica", "r0="+e.URL())
			dir := t.TempDir()
			certFile, keyFile, cert := writePair(t, dir, "tls")
			base := startGatewayTLS(t, cfg, "--http-server", server, "--tls-cert", certFile, "--tls-key", keyFile, "--reload-interval", "50ms")
			roots := x509.NewCertPool()
			roots.AddCert(cert.Leaf)

			resp, err := tlsClient(roots).Post(base+"/v1/chat/completions", "application/json",
				strings.NewReader(`{"model":"m","messages":[{"role":"user","content":"hello"}]}`))
			require.NoError(t, err)
			body, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			require.Equal(t, http.StatusOK, resp.StatusCode, "%s", body)
			assert.Equal(t, "r0", resp.Header.Get(httpgw.HeaderReplica))
			require.NotNil(t, resp.TLS)
			assert.Equal(t, cert.Leaf.Raw, resp.TLS.PeerCertificates[0].Raw)

			addr := strings.TrimPrefix(base, "https://")
			c, err := tls.Dial("tcp", addr, &tls.Config{RootCAs: roots, ServerName: "localhost", NextProtos: []string{"h2", "http/1.1"}})
			require.NoError(t, err)
			assert.Equal(t, "http/1.1", c.ConnectionState().NegotiatedProtocol)
			c.Close()

			// Plain HTTP on the TLS port: no answer of the gateway's.
			pc, err := net.Dial("tcp", addr)
			require.NoError(t, err)
			_, _ = io.WriteString(pc, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
			require.NoError(t, pc.SetReadDeadline(time.Now().Add(10*time.Second)))
			if r, err := http.ReadResponse(bufio.NewReader(pc), nil); err == nil {
				assert.NotEqual(t, http.StatusOK, r.StatusCode)
			}
			pc.Close()

			// A new pair in the same files is served to new connections.
			_, _, cert2 := writePair(t, dir, "tls")
			require.Eventually(t, func() bool {
				c, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true})
				if err != nil {
					return false
				}
				defer c.Close()
				return bytes.Equal(c.ConnectionState().PeerCertificates[0].Raw, cert2.Leaf.Raw)
			}, 10*time.Second, 20*time.Millisecond)
		})
	}
}

// TestGatewayServesMutualTLS: with --tls-client-ca only clients holding a
// certificate from those CAs (and, with --tls-client-san, naming an
// allowed SAN) are served.
func TestGatewayServesMutualTLS(t *testing.T) {
	ca, other := newMTLSCA(t, "clients"), newMTLSCA(t, "others")
	caFile := filepath.Join(t.TempDir(), "ca.pem")
	require.NoError(t, os.WriteFile(caFile, ca.pem, 0o600))
	base := startGatewayTLS(t, newConfig(t), "--tls-self-signed", "--tls-client-ca", caFile, "--tls-client-san", "spiffe://cluster/app")
	get := func(certs ...tls.Certificate) error {
		resp, err := tlsClient(nil, certs...).Get(base + "/healthz")
		if err != nil {
			return err
		}
		resp.Body.Close()
		if resp.StatusCode != http.StatusOK {
			t.Fatalf("status %d", resp.StatusCode)
		}
		return nil
	}
	assert.NoError(t, get(ca.client(t, "spiffe://cluster/app")))
	assert.Error(t, get(), "no client certificate")
	assert.Error(t, get(other.client(t, "spiffe://cluster/app")), "a certificate of another CA")
	assert.Error(t, get(ca.client(t, "spiffe://cluster/other")), "a SAN not allowed")
}

// TestGatewayBadTLSFlags: bad TLS flags and files are one-line usage
// errors (exit 2) naming the flag and its value, before anything serves.
func TestGatewayBadTLSFlags(t *testing.T) {
	dir := t.TempDir()
	certFile, keyFile, _ := writePair(t, dir, "tls")
	missing := filepath.Join(dir, "missing.pem")
	for _, tc := range []struct {
		args []string
		want string
	}{
		{[]string{"--tls-cert", certFile}, `invalid --tls-cert "` + certFile + `": needs --tls-key`},
		{[]string{"--tls-key", keyFile}, `invalid --tls-key "` + keyFile + `": needs --tls-cert`},
		{[]string{"--tls-cert", missing, "--tls-key", keyFile}, `invalid --tls-cert "` + missing + `"`},
		{[]string{"--tls-cert", certFile, "--tls-key", certFile}, `invalid --tls-key "` + certFile + `"`},
		{[]string{"--tls-cert", certFile, "--tls-key", keyFile, "--tls-self-signed"}, "--tls-cert and --tls-self-signed cannot be used together"},
		{[]string{"--tls-client-ca", certFile}, `invalid --tls-client-ca "` + certFile + `": needs TLS`},
		{[]string{"--tls-self-signed", "--tls-client-ca", missing}, `invalid --tls-client-ca "` + missing + `"`},
		{[]string{"--tls-client-san", "spiffe://x/y"}, `invalid --tls-client-san "spiffe://x/y": needs --tls-client-ca`},
		{[]string{"--peer-ca", missing}, `invalid --peer-ca "` + missing + `": peer CA file: open `},
		{[]string{"--peer-ca", keyFile}, `invalid --peer-ca "` + keyFile + `": peer CA file ` + keyFile + `: block 1 is "`},
	} {
		cfg := newConfig(t)
		r := exa(t, cfg, append([]string{"serve", "gateway", "--listen", "127.0.0.1:0"}, tc.args...)...)
		assert.Equal(t, 2, r.code, "%v: stderr %s", tc.args, r.stderr)
		assert.Contains(t, r.stderr, tc.want, "%v", tc.args)
		assert.Equal(t, 1, strings.Count(r.stderr, "\n"), "one-line error: %q", r.stderr)
	}
}
