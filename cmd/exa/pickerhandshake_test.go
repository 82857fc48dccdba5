package main

import (
	"bytes"
	"crypto/tls"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/prometheus/common/expfmt"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/examlops/gateway/picker"
)

// exa_picker_tls_handshake_failures_total has one series per reason, all
// present from the start, and passes the linter (and promtool when
// installed; EXA_REQUIRE_PROMTOOL=1 requires it).
func TestHandshakeCollector(t *testing.T) {
	hl := picker.NewHandshakeLog(picker.HandshakeLogOptions{})
	addr := &net.TCPAddr{IP: net.IPv4(10, 0, 0, 1), Port: 1}
	hl.Refused(addr, tls.RecordHeaderError{Msg: "not TLS"})
	hl.Refused(addr, tls.RecordHeaderError{Msg: "not TLS"})
	hl.Refused(addr, io.EOF)
	reg := prometheus.NewRegistry()
	reg.MustRegister(handshakeCollector(hl)...)
	want := `# HELP exa_picker_tls_handshake_failures_total TLS handshakes the picker's gRPC server refused, by reason (no client certificate, unknown CA, ...; closed: before a TLS hello, as TCP probes).
# TYPE exa_picker_tls_handshake_failures_total counter
exa_picker_tls_handshake_failures_total{reason="bad_certificate"} 0
exa_picker_tls_handshake_failures_total{reason="closed"} 1
exa_picker_tls_handshake_failures_total{reason="no_certificate"} 0
exa_picker_tls_handshake_failures_total{reason="not_tls"} 2
exa_picker_tls_handshake_failures_total{reason="other"} 0
exa_picker_tls_handshake_failures_total{reason="san_not_allowed"} 0
exa_picker_tls_handshake_failures_total{reason="timeout"} 0
exa_picker_tls_handshake_failures_total{reason="unknown_authority"} 0
`
	require.NoError(t, testutil.GatherAndCompare(reg, strings.NewReader(want)))
	problems, err := testutil.GatherAndLint(reg)
	require.NoError(t, err)
	assert.Empty(t, problems)

	promtool, err := exec.LookPath("promtool")
	if err != nil {
		if os.Getenv("EXA_REQUIRE_PROMTOOL") != "" {
			t.Fatal("promtool not found")
		}
		t.Skip("promtool not installed")
	}
	mfs, err := reg.Gather()
	require.NoError(t, err)
	var text bytes.Buffer
	enc := expfmt.NewEncoder(&text, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, mf := range mfs {
		require.NoError(t, enc.Encode(mf))
	}
	cmd := exec.Command(promtool, "check", "metrics")
	cmd.Stdin = &text
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "promtool: %s", out)
}

// The binary with --tls-client-ca logs a handshake refused for want of a
// client certificate as one warning naming the remote address and the
// reason, and counts it on /metrics.
func TestPickerLogsRefusedHandshake(t *testing.T) {
	dir := t.TempDir()
	ca := newMTLSCA(t, "client-ca")
	caFile := filepath.Join(dir, "client-ca.crt")
	require.NoError(t, os.WriteFile(caFile, ca.pem, 0o600))
	addr, line, stderr := startPickerProc(t, "--tls-self-signed", "--tls-client-ca", caFile, "--admin-listen", "127.0.0.1:0")
	m := regexp.MustCompile(`admin (http://\S+) `).FindStringSubmatch(line)
	require.NotNil(t, m, "start-up line %q", line)

	c, err := tls.Dial("tcp", addr, &tls.Config{InsecureSkipVerify: true, NextProtos: []string{"h2"}})
	local := ""
	if err == nil {
		local = c.LocalAddr().String()
		_, err = c.Read(make([]byte, 1)) // TLS 1.3: the refusal arrives here
		c.Close()
	}
	require.Error(t, err, "a client without a certificate was served")

	// The server counts and logs the refusal after it sent the alert, and
	// its stderr is copied by another goroutine: wait for both.
	series := `exa_picker_tls_handshake_failures_total{reason="no_certificate"} 1`
	var body string
	var lines []string
	for deadline := time.Now().Add(20 * time.Second); time.Now().Before(deadline); {
		resp, err := http.Get(m[1] + "/metrics")
		require.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		body = string(b)
		lines = nil
		for _, l := range strings.Split(stderr.String(), "\n") {
			if strings.Contains(l, "refused TLS handshake") {
				lines = append(lines, l)
			}
		}
		if strings.Contains(body, series) && len(lines) > 0 {
			break
		}
	}
	require.Contains(t, body, series)
	require.Len(t, lines, 1, "stderr: %s", stderr.String())
	for _, w := range []string{"level=WARN", "reason=no_certificate", "remote=" + local, `error="tls: client didn't provide a certificate"`} {
		assert.Contains(t, lines[0], w)
	}
}
