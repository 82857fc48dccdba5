package fleet

import (
	"context"
	"crypto/tls"
	"encoding/pem"
	"fmt"
	"io"
	"log"
	"log/slog"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/config"
	"github.com/examlops/gateway/internal/testca"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// caPEM is a self-signed CA certificate in PEM.
func caPEM(tb testing.TB, cn string) []byte { return testca.New(tb, cn).PEM }

// ReadPeerCA takes PEM CERTIFICATE blocks only, and names the file and
// the block at fault.
func TestReadPeerCA(t *testing.T) {
	dir := t.TempDir()
	a, b := caPEM(t, "a"), caPEM(t, "b")
	bad := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: []byte("not DER")})
	key := pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: []byte{1}})
	for _, tc := range []struct {
		name, body, err string
		certs           int
	}{
		{"one", string(a), "", 1},
		{"two, comments around", "# bundle\n" + string(a) + "\n" + string(b) + "\n\n", "", 2},
		{"empty", "", "no PEM certificate", 0},
		{"not PEM", "hello", "no PEM certificate", 0},
		{"a key", string(a) + string(key), `block 2 is "EC PRIVATE KEY", want CERTIFICATE`, 0},
		{"bad DER", string(bad), "block 1: x509: ", 0},
		{"trailing text", string(a) + "junk", "text after block 1 is not PEM", 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			path := filepath.Join(dir, strings.ReplaceAll(tc.name, " ", "_"))
			require.NoError(t, os.WriteFile(path, []byte(tc.body), 0o600))
			pool, err := ReadPeerCA(path)
			if tc.err != "" {
				require.Error(t, err)
				assert.Contains(t, err.Error(), "peer CA file "+path+": "+tc.err)
				assert.Nil(t, pool)
				return
			}
			require.NoError(t, err)
			//lint:ignore SA1019 a pool built here from certificates, not the system pool
			assert.Len(t, pool.Subjects(), tc.certs)
		})
	}
	_, err := ReadPeerCA(filepath.Join(dir, "missing"))
	assert.ErrorContains(t, err, "peer CA file: open ")
	big := filepath.Join(dir, "big")
	require.NoError(t, os.WriteFile(big, make([]byte, maxPeerCABytes+1), 0o600))
	_, err = ReadPeerCA(big)
	assert.ErrorContains(t, err, "over 4194304 bytes")
}

// FuzzParsePeerCA: any bytes give a pool or an error, never a panic,
// never both; a pool only from input with a PEM block.
func FuzzParsePeerCA(f *testing.F) {
	a := caPEM(f, "a")
	f.Add(a)
	f.Add(append(append([]byte{}, a...), a...))
	f.Add([]byte("-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----\n"))
	f.Add([]byte("junk"))
	f.Fuzz(func(t *testing.T, b []byte) {
		pool, err := parsePeerCA(b)
		if err != nil {
			if pool != nil {
				t.Fatal("a pool with an error")
			}
			return
		}
		if n := strings.Count(string(b), "-----BEGIN"); n == 0 {
			t.Fatalf("a pool from %q, which has no PEM block", b)
		}
	})
}

// httpsPeer is an HTTPS peer on 127.0.0.1 whose certificate, from a CA of
// its own, names dns and ips: its port, the CA file, and how many
// connections it has open.
func httpsPeer(t *testing.T, dns []string, ips []net.IP) (int, string, *atomic.Int64) {
	t.Helper()
	ca := testca.New(t, "peer CA")
	cert := ca.Server(t, dns, ips...)
	caFile := filepath.Join(t.TempDir(), "ca.crt")
	require.NoError(t, os.WriteFile(caFile, ca.PEM, 0o600))
	var open atomic.Int64
	h := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "exa_gateway_instance_info{id=\"peer\"} 1\n")
	}))
	h.TLS = &tls.Config{Certificates: []tls.Certificate{*cert}}
	h.Config.ErrorLog = log.New(io.Discard, "", 0)
	h.Config.ConnState = func(_ net.Conn, s http.ConnState) {
		switch s {
		case http.StateNew:
			open.Add(1)
		case http.StateClosed, http.StateHijacked:
			open.Add(-1)
		}
	}
	h.StartTLS()
	t.Cleanup(h.Close)
	return h.Listener.Addr().(*net.TCPAddr).Port, caFile, &open
}

// peerFleet is a fleet with peers, every name resolving to 127.0.0.1.
func peerFleet(t *testing.T, caFile string, peers ...string) *Fleet {
	t.Helper()
	s, err := New(Options{Logger: quietLogger(), InstanceID: "me", PeerCAFile: caFile,
		ScrapeInterval: time.Hour, ProbeInterval: time.Hour, DiscoverInterval: time.Hour, ProbeTimeout: 5 * time.Second, PeerScrapeInterval: 5 * time.Second,
		Resolver: resolverFunc(func(context.Context, string) ([]string, error) { return []string{"127.0.0.1"}, nil })})
	require.NoError(t, err)
	reps := []config.Replica{{Name: "r0", Address: "http://127.0.0.1:1"}}
	require.NoError(t, s.Apply(&config.File{Version: 1, Models: map[string]config.Model{
		testModel: {Mode: gateway.ModeCacheAware, Replicas: reps, Peers: peers}}}))
	return s
}

// peerHeard reports whether base's last scrape succeeded.
func peerHeard(s *Fleet, base string) bool {
	s.peers.mu.Lock()
	defer s.peers.mu.Unlock()
	p := s.peers.peers[base]
	return p != nil && p.up && p.counts != nil
}

// An address reached under two dns+https names is verified for the
// first in byte order, every round (it was whichever the map gave last:
// up 3 of 40 rounds in review); listed as https://ADDRESS too, for its
// own host (it was verified for the name).
func TestPeerServerNameChosen(t *testing.T) {
	port, caFile, _ := httpsPeer(t, []string{"a.test"}, []net.IP{net.IPv4(127, 0, 0, 1)})
	base := fmt.Sprintf("https://127.0.0.1:%d", port)
	s := peerFleet(t, caFile, fmt.Sprintf("dns+https://b.test:%d", port), fmt.Sprintf("dns+https://a.test:%d", port))
	for range 40 {
		s.scrapePeers(context.Background())
		require.True(t, peerHeard(s, base), "verified for a.test, the first name")
	}
	s = peerFleet(t, caFile, fmt.Sprintf("dns+https://b.test:%d", port), fmt.Sprintf("dns+https://c.test:%d", port))
	s.scrapePeers(context.Background())
	assert.False(t, peerHeard(s, base), "verified for b.test, which the certificate does not name")

	port, caFile, _ = httpsPeer(t, []string{"other.test"}, []net.IP{net.IPv4(127, 0, 0, 1)})
	static := fmt.Sprintf("https://127.0.0.1:%d", port)
	both := peerFleet(t, caFile, static, fmt.Sprintf("dns+https://gw.test:%d", port))
	both.scrapePeers(context.Background())
	assert.True(t, peerHeard(both, static), "the listed peer is verified for its own host, not for gw.test")
}

// Close closes the idle connections of the peer scrapes over TLS (they
// stayed open until the transport's idle timeout).
func TestCloseClosesPeerTLSConnections(t *testing.T) {
	port, caFile, open := httpsPeer(t, []string{"gw.test"}, nil)
	s := peerFleet(t, caFile, fmt.Sprintf("dns+https://gw.test:%d", port))
	s.scrapePeers(context.Background())
	require.True(t, peerHeard(s, fmt.Sprintf("https://127.0.0.1:%d", port)))
	require.Equal(t, int64(1), open.Load())
	require.NoError(t, s.Close())
	require.Eventually(t, func() bool { return open.Load() == 0 }, 10*time.Second, 5*time.Millisecond, "peer connections left open after Close")
}

// A corrupt block among good ones is an error, not a CA silently left
// out (pem.Decode passes over it).
func TestParsePeerCACorruptBlock(t *testing.T) {
	good := caPEM(t, "a")
	corrupt := []byte("-----BEGIN CERTIFICATE-----\n!!!! not base64 !!!!\n-----END CERTIFICATE-----\n")
	for _, tc := range []struct {
		b    []byte
		want string
	}{
		{append(append([]byte{}, corrupt...), good...), "1 of 2 blocks are not valid PEM"},
		{append(append(append([]byte{}, good...), corrupt...), good...), "1 of 3 blocks are not valid PEM"},
	} {
		pool, err := parsePeerCA(tc.b)
		assert.EqualError(t, err, tc.want)
		assert.Nil(t, pool)
	}
}

// The CA file is read once at start and kept; a file that fails, then is
// back as it was last read, is logged as read again.
func TestPeerCAFailsAndComesBack(t *testing.T) {
	_, caFile, _ := httpsPeer(t, []string{"gw.test"}, nil)
	var logs strings.Builder
	s, err := New(Options{Logger: slog.New(slog.NewTextHandler(&logs, nil)), PeerCAFile: caFile})
	require.NoError(t, err)
	require.NotNil(t, s.peers.tls.ca)
	good, err := os.ReadFile(caFile)
	require.NoError(t, err)
	fi, err := os.Stat(caFile)
	require.NoError(t, err)
	require.NoError(t, os.Remove(caFile))
	s.refreshPeerCA()
	assert.Equal(t, 1, strings.Count(logs.String(), "peer CA file unreadable"))
	s.refreshPeerCA()
	assert.Equal(t, 1, strings.Count(logs.String(), "peer CA file unreadable"), "logged once")
	require.NoError(t, os.WriteFile(caFile, good, 0o600))
	require.NoError(t, os.Chtimes(caFile, fi.ModTime(), fi.ModTime()))
	s.refreshPeerCA()
	assert.Equal(t, 1, strings.Count(logs.String(), "peer CA file read again"), "back as it was: %s", logs.String())
	require.NoError(t, os.Remove(caFile))
	s.refreshPeerCA()
	assert.Equal(t, 2, strings.Count(logs.String(), "peer CA file unreadable"), "its next failure is logged too")
	require.NotNil(t, s.peers.tls.ca, "the last CAs kept")
}
