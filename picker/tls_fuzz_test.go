package picker

import (
	"crypto/x509"
	"encoding/pem"
	"errors"
	"testing"
	"time"
)

// FuzzKeyPair: any certificate and key file contents give either a pair
// whose leaf parses and matches the key, or a *KeyPairError naming one of
// the two files; never a panic.
func FuzzKeyPair(f *testing.F) {
	cert, err := SelfSigned([]string{"localhost"}, time.Date(2026, 12, 1, 0, 0, 0, 0, time.UTC))
	if err != nil {
		f.Fatal(err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(cert.PrivateKey)
	if err != nil {
		f.Fatal(err)
	}
	certPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: cert.Certificate[0]})
	keyPEM := pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder})
	f.Add(certPEM, keyPEM)
	f.Add(keyPEM, certPEM)
	f.Add(certPEM, []byte("-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n"))
	f.Add([]byte("-----BEGIN CERTIFICATE-----\nMAA=\n-----END CERTIFICATE-----\n"), keyPEM)
	f.Add(append(append([]byte{}, certPEM...), certPEM...), keyPEM)
	f.Add([]byte{}, []byte{})
	f.Fuzz(func(t *testing.T, c, k []byte) {
		got, err := parseKeyPair(c, k, "c.pem", "k.pem")
		if err != nil {
			var kpe *KeyPairError
			if !errors.As(err, &kpe) || (kpe.Key && kpe.Path != "k.pem") || (!kpe.Key && kpe.Path != "c.pem") {
				t.Fatalf("error %v is not a KeyPairError naming its file", err)
			}
			return
		}
		if len(got.Certificate) == 0 || got.Leaf == nil || got.PrivateKey == nil {
			t.Fatalf("pair without leaf or key: %+v", got)
		}
		if _, err := x509.ParseCertificate(got.Certificate[0]); err != nil {
			t.Fatalf("leaf does not parse: %v", err)
		}
	})
}
