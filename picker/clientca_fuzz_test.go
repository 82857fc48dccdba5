package picker

import (
	"bytes"
	"crypto/x509"
	"encoding/pem"
	"testing"
	"time"
)

// FuzzCABundle: any client CA file gives either a pool of as many
// certificates as the file has PEM blocks, each of which crypto/x509
// parses, or an error; never a panic, never an empty pool.
func FuzzCABundle(f *testing.F) {
	cert, err := SelfSigned([]string{"localhost"}, time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC))
	if err != nil {
		f.Fatal(err)
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Certificate[0]})
	kder, err := x509.MarshalPKCS8PrivateKey(cert.PrivateKey)
	if err != nil {
		f.Fatal(err)
	}
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder})
	f.Add(certPEM)
	f.Add(append(append([]byte("# Issuer: exa\n"), certPEM...), certPEM...))
	f.Add(append(append([]byte{}, certPEM...), keyPEM...))
	f.Add(keyPEM)
	f.Add([]byte("-----BEGIN CERTIFICATE-----\nMAA=\n-----END CERTIFICATE-----\n"))
	f.Add(certPEM[:len(certPEM)/2])
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, raw []byte) {
		pool, n, err := parseCABundle(raw)
		if err != nil {
			if pool != nil || n != 0 {
				t.Fatalf("error %v with a pool of %d", err, n)
			}
			return
		}
		if pool == nil || n == 0 {
			t.Fatalf("no error and no certificate")
		}
		blocks := 0
		for rest := raw; ; {
			var b *pem.Block
			if b, rest = pem.Decode(rest); b == nil {
				break
			}
			if _, err := x509.ParseCertificate(b.Bytes); err != nil || b.Type != "CERTIFICATE" {
				t.Fatalf("block %d (%q) accepted: %v", blocks+1, b.Type, err)
			}
			blocks++
		}
		if blocks != n {
			t.Fatalf("%d certificates counted, %d PEM blocks", n, blocks)
		}
		if !bytes.Contains(raw, []byte("-----BEGIN CERTIFICATE-----")) {
			t.Fatal("accepted without a CERTIFICATE block")
		}
	})
}
