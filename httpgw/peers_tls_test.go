package httpgw

import (
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/config"
	"github.com/examlops/gateway/fleet"
	"github.com/examlops/gateway/internal/testca"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// writeFile writes b to path with a modification time of its own, so that
// a reader watching size and time sees every write.
func writeFile(t *testing.T, path string, b []byte, mod time.Time) {
	t.Helper()
	require.NoError(t, os.WriteFile(path, b, 0o600))
	require.NoError(t, os.Chtimes(path, mod, mod))
}

// Two gateways serving HTTPS share the peer list dns+https://NAME:PORT,
// NAME resolving to both: each scrapes the other at its address, with
// the certificate verified for NAME against --peer-ca's CAs. A
// certificate that does not name NAME, and CAs that did not issue it, are
// refused (the peer is down); the CA file is re-read when it changes, and
// the last good CAs are kept while it does not read. Without a CA file
// the system roots do not know the test CA.
func TestPeersByDNSOverTLS(t *testing.T) {
	la, lb := twoAddressesOnePort(t)
	port := la.Addr().(*net.TCPAddr).Port
	ca, other := testca.New(t, "peers CA"), testca.New(t, "another CA")
	const name = "gw-peers.test"
	good, wrongName := ca.Server(t, []string{name}), ca.Server(t, []string{"someone-else.test"})
	caFile := filepath.Join(t.TempDir(), "ca.crt")
	mod := time.Unix(1e9, 0)
	writeFile(t, caFile, ca.PEM, mod)
	res := &fakeResolver{hosts: map[string][]string{name: {"127.0.0.2", "127.0.0.1"}}}
	var now atomic.Int64 // the clock, in ns
	now.Store(1e18)
	clock := func() time.Time { return time.Unix(0, now.Load()) }
	reps := []config.Replica{{Name: "r0", Address: engineMetrics(t)}, {Name: "r1", Address: engineMetrics(t)}}
	entry := fmt.Sprintf("dns+https://%s:%d", name, port)
	mk := func(l net.Listener, caFile string, cert *atomic.Pointer[tls.Certificate]) *Server {
		var cfg *tls.Config
		if l != nil {
			// A handshake a scrape (dnsPeerGateway): a certificate
			// changed below is presented at once.
			cfg = &tls.Config{GetCertificate: func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return cert.Load(), nil }}
		}
		return dnsPeerGateway(t, l, cfg, clock, fleet.Options{Resolver: res, PeerCAFile: caFile}, reps, entry)
	}
	var certA, certB atomic.Pointer[tls.Certificate]
	certA.Store(good)
	certB.Store(good)
	a, b := mk(la, caFile, &certA), mk(lb, caFile, &certB)
	aURL, bURL := fmt.Sprintf("https://127.0.0.1:%d", port), fmt.Sprintf("https://127.0.0.2:%d", port)
	ctx := context.Background()
	busy(t, a, testModel, 40, 1)
	busy(t, b, testModel, 40, 2)
	_, err := b.Snapshot().Models[testModel].Gateway.Route(gateway.Key{1, 2, 3, 4, 5, 6, 7, 8, 9, 10})
	require.NoError(t, err)
	_, err = a.Snapshot().Models[testModel].Gateway.Route(gateway.Key{11, 12, 13})
	require.NoError(t, err)
	a.ScrapeAll(ctx)
	b.ScrapeAll(ctx)
	assert.Equal(t, map[string]int{"r0": 10, "r1": 0}, peerLoad(t, a, testModel), "A hears B over TLS, verified for the name")
	assert.Equal(t, map[string]int{"r0": 3, "r1": 0}, peerLoad(t, b, testModel), "B hears A")
	page := metricsPage(t, aURL)
	assert.Contains(t, page, fmt.Sprintf(`exa_gateway_peer_up{peer=%q} 1`, bURL))
	assert.Contains(t, page, fmt.Sprintf(`exa_gateway_peer_self{peer=%q} 1`, aURL), "A reached itself over TLS too")
	assert.Contains(t, metricsPage(t, bURL), fmt.Sprintf(`exa_gateway_peer_self{peer=%q} 1`, bURL), "and B itself")

	// B presents a certificate that does not name NAME: A refuses it.
	certB.Store(wrongName)
	now.Add(int64(time.Second))
	a.ScrapeAll(ctx)
	assert.Contains(t, metricsPage(t, aURL), fmt.Sprintf(`exa_gateway_peer_up{peer=%q} 0`, bURL), "a certificate for another name")
	certB.Store(good)
	now.Add(int64(time.Second))
	a.ScrapeAll(ctx)
	assert.Contains(t, metricsPage(t, aURL), fmt.Sprintf(`exa_gateway_peer_up{peer=%q} 1`, bURL))

	// A's CA file now holds another CA: re-read, B is refused.
	mod = mod.Add(time.Second)
	writeFile(t, caFile, other.PEM, mod)
	now.Add(int64(time.Second))
	a.ScrapeAll(ctx)
	assert.Contains(t, metricsPage(t, aURL), fmt.Sprintf(`exa_gateway_peer_up{peer=%q} 0`, bURL), "CAs that did not issue B's certificate")
	// A file that no longer reads keeps the last CAs (still the other's).
	mod = mod.Add(time.Second)
	writeFile(t, caFile, []byte("not PEM"), mod)
	now.Add(int64(time.Second))
	a.ScrapeAll(ctx)
	assert.Contains(t, metricsPage(t, aURL), fmt.Sprintf(`exa_gateway_peer_up{peer=%q} 0`, bURL))
	// Both CAs: B is heard again.
	mod = mod.Add(time.Second)
	writeFile(t, caFile, append(append([]byte{}, other.PEM...), ca.PEM...), mod)
	now.Add(int64(time.Second))
	a.ScrapeAll(ctx)
	assert.Contains(t, metricsPage(t, aURL), fmt.Sprintf(`exa_gateway_peer_up{peer=%q} 1`, bURL))
	assert.Equal(t, map[string]int{"r0": 10, "r1": 0}, peerLoad(t, a, testModel))

	// A gateway without a CA file trusts the system roots, which do not
	// hold the test CA.
	c := mk(nil, "", nil)
	busy(t, c, testModel, 40, 3)
	c.ScrapeAll(ctx)
	assert.Equal(t, map[string]int{"r0": 0, "r1": 0}, peerLoad(t, c, testModel), "no CA file: nothing heard")
}

// A bad --peer-ca stops New, naming the file; a good one is taken.
func TestPeerCAFileAtStart(t *testing.T) {
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.crt")
	require.NoError(t, os.WriteFile(bad, []byte("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"), 0o600))
	_, err := New(Options{Logger: quietLogger(), Fleet: fleet.Options{PeerCAFile: bad}})
	require.ErrorIs(t, err, fleet.ErrInvalidOptions)
	assert.ErrorContains(t, err, bad)
	assert.ErrorContains(t, err, `block 1 is "PRIVATE KEY", want CERTIFICATE`)
	good := filepath.Join(dir, "ca.crt")
	require.NoError(t, os.WriteFile(good, testca.New(t, "a").PEM, 0o600))
	_, err = New(Options{Logger: quietLogger(), Fleet: fleet.Options{PeerCAFile: good}})
	require.NoError(t, err)
}
