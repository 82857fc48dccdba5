package main

import (
	"context"
	"crypto/sha256"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"io/fs"
	"log/slog"
	"net"
	"os"
	"time"

	"github.com/examlops/gateway/picker"
	"github.com/spf13/cobra"
)

// pickerTLSSource is where the picker's gRPC server gets its certificate:
// files (kp, re-read by watchKeyPair) or a self-signed one made at start.
type pickerTLSSource struct {
	kp       *picker.KeyPair
	self     *tls.Certificate
	certFile string
}

func (s *pickerTLSSource) get(h *tls.ClientHelloInfo) (*tls.Certificate, error) {
	if s.kp != nil {
		return s.kp.GetCertificate(h)
	}
	return s.self, nil
}

// describe is the serving mode for the start-up line.
func (s *pickerTLSSource) describe() string {
	if s.kp != nil {
		return "TLS, certificate " + s.certFile
	}
	sum := sha256.Sum256(s.self.Certificate[0])
	return "TLS, self-signed certificate sha256 " + hex.EncodeToString(sum[:])
}

// pickerTLS checks the TLS flags and loads or makes the certificate: nil
// for plaintext. Bad files are usage errors naming the flag and the file.
func pickerTLS(cmd *cobra.Command, fl pickerFlags) (*pickerTLSSource, error) {
	for _, f := range []struct{ name, v string }{{"tls-cert", fl.tlsCert}, {"tls-key", fl.tlsKey}} {
		if cmd.Flags().Changed(f.name) && f.v == "" {
			return nil, usagef("invalid --%s %q: must name a PEM file", f.name, f.v)
		}
	}
	switch {
	case fl.tlsSelfSigned:
		cert, err := picker.SelfSigned(selfSignedHosts(fl.listen), time.Now())
		if err != nil {
			return nil, err
		}
		return &pickerTLSSource{self: &cert}, nil
	case fl.tlsCert == "" && fl.tlsKey == "":
		return nil, nil
	case fl.tlsKey == "":
		return nil, usagef("invalid --tls-cert %q: needs --tls-key, its private key file", fl.tlsCert)
	case fl.tlsCert == "":
		return nil, usagef("invalid --tls-key %q: needs --tls-cert, its certificate file", fl.tlsKey)
	}
	kp, err := picker.LoadKeyPair(fl.tlsCert, fl.tlsKey)
	if err != nil {
		return nil, keyPairUsage(err, fl)
	}
	return &pickerTLSSource{kp: kp, certFile: fl.tlsCert}, nil
}

// keyPairUsage rewrites a picker.KeyPairError as a usage error naming the
// flag at fault and its value.
func keyPairUsage(err error, fl pickerFlags) error {
	var kpe *picker.KeyPairError
	if !errors.As(err, &kpe) {
		return err
	}
	var pe *fs.PathError
	if kpe.Key && errors.As(kpe.Err, &pe) {
		return usagef("invalid --tls-key %q: %v", fl.tlsKey, kpe.Err)
	}
	if kpe.Key {
		return usagef("invalid --tls-key %q: %v (certificate --tls-cert %q)", fl.tlsKey, kpe.Err, fl.tlsCert)
	}
	return usagef("invalid --tls-cert %q: %v", fl.tlsCert, kpe.Err)
}

// selfSignedHosts are the names a self-signed certificate is made for:
// localhost, the loopback addresses, the machine's host name and the
// --listen host when it names one. Envoy, as GIE configures it for a
// self-signed picker, verifies none of them.
func selfSignedHosts(listen string) []string {
	hosts := []string{"localhost", "127.0.0.1", "::1"}
	if h, err := os.Hostname(); err == nil && h != "" {
		hosts = append(hosts, h)
	}
	if h, _, err := net.SplitHostPort(listen); err == nil && h != "" {
		if ip := net.ParseIP(h); ip == nil || !ip.IsUnspecified() {
			hosts = append(hosts, h)
		}
	}
	return hosts
}

// watchKeyPair re-reads the certificate and key files at every tick until
// ctx ends (keyPairWatcher.reload).
func watchKeyPair(ctx context.Context, kp *picker.KeyPair, tick <-chan time.Time, logger *slog.Logger) {
	w := &keyPairWatcher{kp: kp, logger: logger}
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick:
			w.reload()
		}
	}
}

// keyPairWatcher reloads a KeyPair and logs what came of it.
type keyPairWatcher struct {
	kp      *picker.KeyPair
	logger  *slog.Logger
	lastErr string
}

// reload re-reads the files. A change is logged; a failed reload is
// logged once per distinct error, and the last good pair keeps being
// served.
func (w *keyPairWatcher) reload() {
	changed, err := w.kp.Reload()
	switch {
	case err != nil:
		if err.Error() != w.lastErr {
			w.logger.Warn("TLS certificate not reloaded; serving the previous one", "err", err)
			w.lastErr = err.Error()
		}
		return
	case changed:
		leaf := w.kp.Certificate().Leaf
		w.logger.Info("TLS certificate reloaded", "subject", leaf.Subject.String(), "not_after", leaf.NotAfter.Format(time.RFC3339))
		warnValidity(w.kp.Certificate(), time.Now(), w.logger)
	}
	w.lastErr = ""
}

// warnValidity logs when the certificate served is outside its validity
// period: Envoy configured without verification serves it anyway, a
// verifying client does not.
func warnValidity(cert *tls.Certificate, now time.Time, logger *slog.Logger) {
	if cert == nil || cert.Leaf == nil {
		return
	}
	if l := cert.Leaf; now.After(l.NotAfter) || now.Before(l.NotBefore) {
		logger.Warn("TLS certificate is not valid now", "not_before", l.NotBefore.Format(time.RFC3339),
			"not_after", l.NotAfter.Format(time.RFC3339))
	}
}
