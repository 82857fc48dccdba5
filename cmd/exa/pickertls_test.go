package main

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/examlops/gateway/config"
	"github.com/examlops/gateway/internal/fronttest"
	"github.com/examlops/gateway/picker"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
)

// writePair writes a new self-signed certificate for "localhost" and its
// key as PEM files in dir, named prefix.crt and prefix.key.
func writePair(t *testing.T, dir, prefix string) (certFile, keyFile string, cert tls.Certificate) {
	t.Helper()
	cert, err := picker.SelfSigned([]string{"localhost"}, time.Now())
	require.NoError(t, err)
	kder, err := x509.MarshalPKCS8PrivateKey(cert.PrivateKey)
	require.NoError(t, err)
	certFile, keyFile = filepath.Join(dir, prefix+".crt"), filepath.Join(dir, prefix+".key")
	require.NoError(t, os.WriteFile(certFile, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Certificate[0]}), 0o600))
	require.NoError(t, os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), 0o600))
	return certFile, keyFile, cert
}

// TestPickerBadTLSFlags: bad TLS flags and files are one-line usage
// errors (exit 2) naming the flag and its value, before anything serves.
func TestPickerBadTLSFlags(t *testing.T) {
	dir := t.TempDir()
	certA, keyA, _ := writePair(t, dir, "a")
	_, keyB, _ := writePair(t, dir, "b")
	missing := filepath.Join(dir, "missing.pem")
	for _, tt := range []struct {
		name string
		args []string
		want string
	}{
		{"cert alone", []string{"--tls-cert", certA}, `invalid --tls-cert "` + certA + `": needs --tls-key, its private key file`},
		{"key alone", []string{"--tls-key", keyA}, `invalid --tls-key "` + keyA + `": needs --tls-cert, its certificate file`},
		{"empty cert", []string{"--tls-cert", "", "--tls-key", keyA}, `invalid --tls-cert "": must name a PEM file`},
		{"missing cert", []string{"--tls-cert", missing, "--tls-key", keyA}, `invalid --tls-cert "` + missing + `": open ` + missing + `: no such file or directory`},
		{"missing key", []string{"--tls-cert", certA, "--tls-key", missing}, `invalid --tls-key "` + missing + `": open ` + missing + `: no such file or directory`},
		{"unreadable key", []string{"--tls-cert", certA, "--tls-key", dir}, `invalid --tls-key "` + dir + `": read ` + dir + `: is a directory`},
		{"unreadable cert", []string{"--tls-cert", dir, "--tls-key", keyA}, `invalid --tls-cert "` + dir + `": read ` + dir + `: is a directory`},
		{"mismatched", []string{"--tls-cert", certA, "--tls-key", keyB}, `invalid --tls-key "` + keyB + `": tls: private key does not match public key (certificate --tls-cert "` + certA + `")`},
		{"swapped", []string{"--tls-cert", keyA, "--tls-key", certA}, `invalid --tls-cert "` + keyA + `": no PEM CERTIFICATE block in it`},
		{"self-signed and cert", []string{"--tls-self-signed", "--tls-cert", certA, "--tls-key", keyA}, `--tls-cert and --tls-self-signed cannot be used together`},
		{"self-signed off", []string{"--tls-self-signed=false", "--tls-cert", certA}, `invalid --tls-cert "` + certA + `": needs --tls-key, its private key file`},
		{"self-signed and key", []string{"--tls-self-signed", "--tls-key", keyA}, `--tls-key and --tls-self-signed cannot be used together`},
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

// startPickerBin runs `exa serve picker` with args on a free port and
// returns the ext_proc address from its start-up line, and that line.
func startPickerBin(t *testing.T, args ...string) (addr, line string) {
	t.Helper()
	addr, line, _ = startPickerProc(t, args...)
	return addr, line
}

// startPickerProc is startPickerBin also returning the process's stderr.
func startPickerProc(t *testing.T, args ...string) (addr, line string, stderr *fronttest.SyncBuffer) {
	t.Helper()
	addr, line, stderr, _ = startPickerCmd(t, args...)
	return addr, line, stderr
}

// startPickerCmd is startPickerProc also returning the process.
func startPickerCmd(t *testing.T, args ...string) (addr, line string, stderr *fronttest.SyncBuffer, proc *os.Process) {
	t.Helper()
	return startPickerWith(t, newConfig(t), args...)
}

// startPickerWith is startPickerCmd with the routing config at cfg.
func startPickerWith(t *testing.T, cfg string, args ...string) (addr, line string, stderr *fronttest.SyncBuffer, proc *os.Process) {
	t.Helper()
	bin := exaBin
	if b := os.Getenv("EXA_PICKER_BIN"); b != "" && os.Getenv("EXA_MEASURE") != "" {
		bin = b // a measurement of another build, such as an earlier commit's
	}
	all := append([]string{"serve", "picker", "--listen", "127.0.0.1:0", "--admin-listen", ""}, args...)
	return startExa(t, bin, cfg, `picker listening on (\S+) `, all...)
}

// startExa starts the exa binary bin with args and the routing config at
// cfg, killed when the test ends, waits up to 20 s for its start-up line
// on stdout (the rest is discarded) and returns the first submatch of
// pattern in it, the line, its stderr and the process.
func startExa(t *testing.T, bin, cfg, pattern string, args ...string) (match, line string, stderr *fronttest.SyncBuffer, proc *os.Process) {
	t.Helper()
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), config.EnvVar+"="+cfg, "EXA_GATEWAY=")
	stderr = &fronttest.SyncBuffer{}
	cmd.Stderr = stderr
	out, err := cmd.StdoutPipe()
	require.NoError(t, err)
	require.NoError(t, cmd.Start())
	t.Cleanup(func() {
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
	})
	lines := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		if sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		_, _ = io.Copy(io.Discard, out)
	}()
	select {
	case line = <-lines:
	case <-time.After(20 * time.Second):
		t.Fatalf("no start-up line within 20 s; stderr: %s", stderr.String())
	}
	m := regexp.MustCompile(pattern).FindStringSubmatch(line)
	require.NotNil(t, m, "start-up line %q; stderr: %s", line, stderr.String())
	return m[1], line, stderr, cmd.Process
}

// healthCheck asks the picker's gRPC health service over creds.
func healthCheck(t *testing.T, addr string, creds credentials.TransportCredentials) error {
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	require.NoError(t, err)
	defer conn.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	r, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: picker.ServiceName})
	if err == nil {
		require.Equal(t, healthpb.HealthCheckResponse_SERVING, r.GetStatus())
	}
	return err
}

// The binary serves TLS with certificate files or a self-signed
// certificate, and plaintext clients are refused; without TLS flags it
// serves plaintext.
func TestPickerServesTLS(t *testing.T) {
	certFile, keyFile, cert := writePair(t, t.TempDir(), "tls")
	roots := x509.NewCertPool()
	roots.AddCert(cert.Leaf)

	addr, line := startPickerBin(t, "--tls-cert", certFile, "--tls-key", keyFile)
	assert.Contains(t, line, "(ext_proc gRPC, TLS, certificate "+certFile+")")
	require.NoError(t, healthCheck(t, addr, credentials.NewTLS(&tls.Config{RootCAs: roots, ServerName: "localhost"})))
	require.Error(t, healthCheck(t, addr, insecure.NewCredentials()), "plaintext client")

	addr, line = startPickerBin(t, "--tls-self-signed")
	assert.Regexp(t, `\(ext_proc gRPC, TLS, self-signed certificate sha256 [0-9a-f]{64}\)`, line)
	require.NoError(t, healthCheck(t, addr, credentials.NewTLS(&tls.Config{InsecureSkipVerify: true})))
	require.Error(t, healthCheck(t, addr, credentials.NewTLS(&tls.Config{RootCAs: roots, ServerName: "localhost"})), "a client verifying the certificate")
	require.Error(t, healthCheck(t, addr, insecure.NewCredentials()), "plaintext client")

	addr, line = startPickerBin(t)
	assert.Contains(t, line, "(ext_proc gRPC, plaintext)")
	require.NoError(t, healthCheck(t, addr, insecure.NewCredentials()))
}

// keyPairWatcher reloads changed files, logs a failed reload once and
// keeps the previous pair; watchKeyPair reloads at each tick.
func TestWatchKeyPair(t *testing.T) {
	dir := t.TempDir()
	aCert, aKey, a := writePair(t, dir, "a")
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	copyFile := func(dst, src string) {
		raw, err := os.ReadFile(src)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(dst, raw, 0o600))
	}
	copyFile(certFile, aCert)
	copyFile(keyFile, aKey)
	kp, err := picker.LoadKeyPair(certFile, keyFile)
	require.NoError(t, err)
	var logs bytes.Buffer
	w := &keyPairWatcher{kp: kp, logger: slog.New(slog.NewTextHandler(&logs, nil))}

	w.reload()
	assert.Equal(t, a.Certificate[0], kp.Certificate().Certificate[0], "unchanged files")
	assert.Empty(t, logs.String())

	bCert, bKey, b := writePair(t, dir, "b")
	copyFile(certFile, bCert) // new certificate, old key
	w.reload()
	w.reload()
	assert.Equal(t, a.Certificate[0], kp.Certificate().Certificate[0], "a mismatched pair is not served")
	assert.Equal(t, 1, strings.Count(logs.String(), "TLS certificate not reloaded"), "logged once: %s", logs.String())
	assert.Contains(t, logs.String(), "private key does not match public key")

	copyFile(keyFile, bKey)
	w.reload()
	assert.Equal(t, b.Certificate[0], kp.Certificate().Certificate[0], "the new pair is served")
	assert.Contains(t, logs.String(), "TLS certificate reloaded")

	// The loop: one tick reloads (back to A), then it ends with ctx.
	copyFile(certFile, aCert)
	copyFile(keyFile, aKey)
	ctx, cancel := context.WithCancel(context.Background())
	tick := make(chan time.Time) // unbuffered: the send returns once the loop has the tick
	done := make(chan struct{})
	go func() { watchKeyPair(ctx, kp, tick, slog.New(slog.DiscardHandler)); close(done) }()
	tick <- time.Time{}
	cancel()
	<-done
	assert.Equal(t, a.Certificate[0], kp.Certificate().Certificate[0], "reloaded at the tick")
}
