package fleet

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// caPEM is a self-signed CA certificate in PEM.
func caPEM(tb testing.TB, cn string) []byte {
	tb.Helper()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	require.NoError(tb, err)
	tmpl := &x509.Certificate{SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: cn},
		NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	require.NoError(tb, err)
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

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

// FuzzParsePeerCA: any bytes give a pool or an error, never a panic; a
// pool holds a certificate for each block.
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
