package picker_test

import (
	"bytes"
	"crypto/tls"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"google.golang.org/grpc/credentials"

	"github.com/examlops/gateway/picker"
)

// lockedBuffer is a log sink safe for the server goroutine.
type lockedBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.Write(p)
}

func (l *lockedBuffer) lines() []string {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := strings.TrimSpace(l.b.String())
	if s == "" {
		return nil
	}
	return strings.Split(s, "\n")
}

// fakeClock is an injected clock moved by the test.
type fakeClock struct{ ns atomic.Int64 }

func (c *fakeClock) now() time.Time          { return time.Unix(0, c.ns.Load()) }
func (c *fakeClock) advance(d time.Duration) { c.ns.Add(int64(d)) }

// handshakeServer runs the wrapped gRPC TLS credentials' ServerHandshake
// on every connection to a loopback listener, reporting its error.
func handshakeServer(t *testing.T, creds credentials.TransportCredentials) (string, chan error) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	results := make(chan error, 16)
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
			conn, _, err := creds.ServerHandshake(c)
			if err == nil {
				_, _ = conn.Write([]byte("ok"))
				conn.Close()
			}
			c.Close()
			results <- err
		}
	}()
	return ln.Addr().String(), results
}

// mtlsHandshakeLog serves mutual TLS (client CA clientCA, SANs sans)
// through a HandshakeLog with a fake clock.
func mtlsHandshakeLog(t *testing.T, srvCA, clientCA *testCA, sans []string) (*picker.HandshakeLog, *fakeClock, *lockedBuffer, func(conn func(addr string)) error) {
	t.Helper()
	caFile := filepath.Join(t.TempDir(), "client-ca.crt")
	writeFile(t, caFile, clientCA.pem)
	cas, err := picker.LoadClientCAs(caFile)
	if err != nil {
		t.Fatal(err)
	}
	pair := serverPair(t, srvCA)
	get := func(*tls.ClientHelloInfo) (*tls.Certificate, error) { return pair, nil }
	clock := &fakeClock{}
	clock.ns.Store(time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano())
	var logs lockedBuffer
	hl := picker.NewHandshakeLog(picker.HandshakeLogOptions{Logger: slog.New(slog.NewTextHandler(&logs, nil)), Now: clock.now})
	addr, results := handshakeServer(t, hl.Credentials(credentials.NewTLS(picker.MutualTLSConfig(get, cas, sans))))
	run := func(conn func(addr string)) error {
		conn(addr)
		return <-results
	}
	return hl, clock, &logs, run
}

// tlsClient handshakes presenting certs[0] (none when empty) and reads
// the server's "ok".
func tlsClient(roots *tls.Config, certs ...tls.Certificate) func(addr string) {
	return func(addr string) {
		cfg := roots.Clone()
		if len(certs) > 0 {
			cfg.GetClientCertificate = func(*tls.CertificateRequestInfo) (*tls.Certificate, error) { return &certs[0], nil }
		}
		c, err := tls.Dial("tcp", addr, cfg)
		if err == nil {
			_, _ = c.Read(make([]byte, 2))
			c.Close()
		}
	}
}

// A real handshake refused for each reason gives one warning naming the
// remote address and the reason, and one count under that reason; a TCP
// probe (closed before its hello) is counted but not logged; an accepted
// client neither.
func TestHandshakeLogRefused(t *testing.T) {
	srvCA, clientCA, otherCA := newCA(t, "server-ca"), newCA(t, "client-ca"), newCA(t, "other-ca")
	hl, clock, logs, run := mtlsHandshakeLog(t, srvCA, clientCA, []string{"spiffe://cluster.local/ns/gw/sa/envoy"})
	client := &tls.Config{RootCAs: srvCA.pool(), ServerName: "picker.test", NextProtos: []string{"h2"}}
	envoy := clientCA.issueClient(t, clientCert{uris: []string{"spiffe://cluster.local/ns/gw/sa/envoy"}})

	if err := run(tlsClient(client, envoy)); err != nil {
		t.Fatalf("accepted client: %v", err)
	}
	want := map[string]uint64{}
	for _, r := range picker.HandshakeReasons() {
		want[r] = 0
	}
	for _, tc := range []struct {
		name   string
		conn   func(addr string)
		reason string
		logged bool
	}{
		{"no certificate", tlsClient(client), picker.ReasonNoCertificate, true},
		{"another CA", tlsClient(client, otherCA.issueClient(t, clientCert{})), picker.ReasonUnknownAuthority, true},
		{"expired", tlsClient(client, clientCA.issueClient(t, clientCert{notAfter: time.Now().Add(-time.Minute),
			uris: []string{"spiffe://cluster.local/ns/gw/sa/envoy"}})), picker.ReasonBadCertificate, true},
		{"SAN not allowed", tlsClient(client, clientCA.issueClient(t, clientCert{dns: []string{"intruder.test"}})), picker.ReasonSANNotAllowed, true},
		{"plaintext gRPC", func(addr string) {
			c, err := net.Dial("tcp", addr)
			if err == nil {
				_, _ = c.Write([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"))
				_, _ = c.Read(make([]byte, 64))
				c.Close()
			}
		}, picker.ReasonNotTLS, true},
		{"TCP probe", func(addr string) {
			if c, err := net.Dial("tcp", addr); err == nil {
				c.Close()
			}
		}, picker.ReasonClosed, false},
	} {
		before := len(logs.lines())
		clock.advance(picker.DefaultHandshakeLogInterval) // past the rate limit of 127.0.0.1
		if err := run(tc.conn); err == nil {
			t.Fatalf("%s: handshake accepted", tc.name)
		}
		want[tc.reason]++
		if got := hl.Failures(); fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("%s: failures %v, want %v", tc.name, got, want)
		}
		lines := logs.lines()[before:]
		if !tc.logged {
			if len(lines) != 0 {
				t.Errorf("%s: logged %q, want nothing", tc.name, lines)
			}
			continue
		}
		if len(lines) != 1 {
			t.Fatalf("%s: %d log lines %q, want 1", tc.name, len(lines), lines)
		}
		for _, w := range []string{"level=WARN", `msg="picker: refused TLS handshake"`, "remote=127.0.0.1:", "reason=" + tc.reason, "not_logged_since_last=0"} {
			if !strings.Contains(lines[0], w) {
				t.Errorf("%s: log line %q lacks %q", tc.name, lines[0], w)
			}
		}
	}
}

// A burst of refusals from one address is all counted but logged once per
// interval; the next line says how many were not logged.
func TestHandshakeLogBurst(t *testing.T) {
	srvCA, clientCA := newCA(t, "server-ca"), newCA(t, "client-ca")
	hl, clock, logs, run := mtlsHandshakeLog(t, srvCA, clientCA, nil)
	noCert := tlsClient(&tls.Config{RootCAs: srvCA.pool(), ServerName: "picker.test", NextProtos: []string{"h2"}})
	for range 5 {
		if err := run(noCert); err == nil {
			t.Fatal("handshake without a certificate accepted")
		}
		clock.advance(10 * time.Second)
	}
	if n := hl.Failures()[picker.ReasonNoCertificate]; n != 5 {
		t.Fatalf("counted %d, want 5", n)
	}
	if lines := logs.lines(); len(lines) != 1 {
		t.Fatalf("%d lines %q, want 1 for 5 refusals within a minute", len(lines), lines)
	}
	clock.advance(10 * time.Second) // 60s after the first line
	if err := run(noCert); err == nil {
		t.Fatal("handshake without a certificate accepted")
	}
	lines := logs.lines()
	if len(lines) != 2 || !strings.Contains(lines[1], "not_logged_since_last=4") {
		t.Fatalf("lines %q, want a second one with not_logged_since_last=4", lines)
	}
	if n := hl.Failures()[picker.ReasonNoCertificate]; n != 6 {
		t.Fatalf("counted %d, want 6", n)
	}
}

// The per-address state is bounded by MaxAddrs: addresses beyond it share
// one line per interval until a sweep frees the expired ones.
func TestHandshakeLogBound(t *testing.T) {
	clock := &fakeClock{}
	var logs lockedBuffer
	hl := picker.NewHandshakeLog(picker.HandshakeLogOptions{Logger: slog.New(slog.NewTextHandler(&logs, nil)), Now: clock.now,
		MaxAddrs: 2, Interval: time.Minute})
	refuse := func(ip string) {
		hl.Refused(&net.TCPAddr{IP: net.ParseIP(ip), Port: 40000}, tls.RecordHeaderError{Msg: "not TLS"})
	}
	refuse("10.0.0.1")
	refuse("10.0.0.2")
	refuse("10.0.0.3") // over the bound: the shared line
	refuse("10.0.0.4") // shares it: not logged
	refuse("10.0.0.1") // remembered: not logged
	lines := logs.lines()
	if len(lines) != 3 {
		t.Fatalf("%d lines %q, want 3", len(lines), lines)
	}
	for i, ip := range []string{"10.0.0.1", "10.0.0.2", "10.0.0.3"} {
		if !strings.Contains(lines[i], "remote=10.0.0."+ip[len(ip)-1:]+":40000") || !strings.Contains(lines[i], "reason=not_tls") {
			t.Errorf("line %d %q, want remote %s reason not_tls", i, lines[i], ip)
		}
	}
	clock.advance(time.Minute) // the remembered ones expire: a new address sweeps them
	refuse("10.0.0.5")
	refuse("10.0.0.6")
	refuse("10.0.0.7") // the bound again: shared line
	if lines := logs.lines(); len(lines) != 6 || !strings.Contains(lines[5], "remote=10.0.0.7:40000") ||
		!strings.Contains(lines[5], "not_logged_since_last=1") {
		t.Fatalf("lines %q, want 6, the last for 10.0.0.7 counting 10.0.0.4 not logged", lines)
	}
	if n := hl.Failures()[picker.ReasonNotTLS]; n != 8 {
		t.Fatalf("counted %d, want 8", n)
	}
}

// TestMeasureHandshakeLogMemory reports the heap the per-address state
// holds at its bound (EXA_MEASURE_HANDSHAKE=1, -v); docs/picker.md quotes it.
func TestMeasureHandshakeLogMemory(t *testing.T) {
	if os.Getenv("EXA_MEASURE_HANDSHAKE") == "" {
		t.Skip("set EXA_MEASURE_HANDSHAKE=1")
	}
	clock := &fakeClock{}
	hl := picker.NewHandshakeLog(picker.HandshakeLogOptions{Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Now: clock.now})
	addrs := make([]net.Addr, 4*picker.DefaultHandshakeLogAddrs)
	for i := range addrs {
		// IPv6 addresses: the longest keys.
		addrs[i] = &net.TCPAddr{IP: net.ParseIP(fmt.Sprintf("2001:db8:ffff:ffff:ffff:ffff:%x:%x", i>>16, i&0xffff)), Port: 65535}
	}
	heap := func() uint64 {
		var m runtime.MemStats
		runtime.GC()
		runtime.GC()
		runtime.ReadMemStats(&m)
		return m.HeapAlloc
	}
	for _, a := range addrs[:1] { // warm up the logger and the error's formatting
		hl.Refused(a, tls.RecordHeaderError{Msg: "not TLS"})
	}
	before := heap()
	for _, a := range addrs[1:] {
		hl.Refused(a, tls.RecordHeaderError{Msg: "not TLS"})
	}
	after := heap()
	runtime.KeepAlive(hl)
	runtime.KeepAlive(addrs)
	t.Logf("%d remote addresses refused, state bound %d: heap grew %d bytes", len(addrs), picker.DefaultHandshakeLogAddrs,
		int64(after)-int64(before))
}
