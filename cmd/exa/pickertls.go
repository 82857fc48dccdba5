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
	"net/netip"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/examlops/gateway/picker"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// tlsFlags are the --tls-* flags of the picker's gRPC server and of the
// gateway's HTTP server.
type tlsFlags struct {
	tlsCert, tlsKey string
	tlsSelfSigned   bool
	tlsClientCA     string
	tlsClientSANs   []string
}

// tlsHelp is what the --tls-* flags' help says of one server.
type tlsHelp struct{ serves, selfSigned, client, sanExample string }

// registerTLS adds the --tls-* flags to f.
func (t *tlsFlags) registerTLS(f *pflag.FlagSet, h tlsHelp) {
	f.StringVar(&t.tlsCert, "tls-cert", "",
		h.serves+" with this PEM certificate file (server certificate first, then intermediates); needs --tls-key; both files are re-read every --reload-interval when they change, and new connections get the new pair")
	f.StringVar(&t.tlsKey, "tls-key", "", "PEM private key file of --tls-cert")
	f.BoolVar(&t.tlsSelfSigned, "tls-self-signed", false, h.serves+" with a self-signed certificate made at start "+h.selfSigned)
	f.StringVar(&t.tlsClientCA, "tls-client-ca", "",
		"require "+h.client+" to present a certificate chained to a CA of this PEM bundle (mutual TLS), or the handshake fails; needs --tls-cert/--tls-key or --tls-self-signed; re-read every --reload-interval when it changes")
	f.StringArrayVar(&t.tlsClientSANs, "tls-client-san", nil,
		"with --tls-client-ca: accept only client certificates naming this subject alternative name, compared with the SANs of its form: a URI (scheme:..., e.g. "+h.sanExample+") with URI SANs, an IP with IP SANs, an email with email SANs, else a DNS name (any case) with DNS SANs (repeatable); default any name")
}

// exclusive refuses --tls-cert or --tls-key with --tls-self-signed.
func (t tlsFlags) exclusive(cmd *cobra.Command) error {
	for _, f := range []string{"tls-cert", "tls-key"} {
		if t.tlsSelfSigned && cmd.Flags().Changed(f) {
			return usagef("--%s and --tls-self-signed cannot be used together", f)
		}
	}
	return nil
}

// tlsSource is where a server (the picker's gRPC server, the gateway's
// HTTP server) gets its certificate: files (kp, re-read by watchKeyPair)
// or a self-signed one made at start.
type tlsSource struct {
	kp       *picker.KeyPair
	self     *tls.Certificate
	certFile string

	// cas, when not nil, are the CAs client certificates must chain to
	// (--tls-client-ca, re-read by watchClientCAs), sans the client
	// certificate names allowed (--tls-client-san; empty: any).
	cas    *picker.ClientCAs
	caFile string
	sans   []string
}

// config is the gRPC server's TLS configuration.
func (s *tlsSource) config() *tls.Config {
	if s.cas != nil {
		return picker.MutualTLSConfig(s.get, s.cas, s.sans)
	}
	return picker.TLSConfig(s.get)
}

// httpConfig is the gateway's TLS configuration: config's, offering
// HTTP/1.1 alone by ALPN (the front servers speak nothing else).
func (s *tlsSource) httpConfig() *tls.Config {
	c := s.config()
	c.NextProtos = []string{"http/1.1"}
	return c
}

func (s *tlsSource) get(h *tls.ClientHelloInfo) (*tls.Certificate, error) {
	if s.kp != nil {
		return s.kp.GetCertificate(h)
	}
	return s.self, nil
}

// describe is the serving mode for the start-up line.
func (s *tlsSource) describe() string {
	var d string
	if s.kp != nil {
		d = "TLS, certificate " + s.certFile
	} else {
		sum := sha256.Sum256(s.self.Certificate[0])
		d = "TLS, self-signed certificate sha256 " + hex.EncodeToString(sum[:])
	}
	if s.cas != nil {
		d += ", client certificates required from CA file " + s.caFile
		if len(s.sans) > 0 {
			d += " naming " + strings.Join(s.sans, " or ")
		}
	}
	return d
}

// loadTLS checks the TLS flags and loads or makes the certificate (a
// self-signed one also for the host of listen), and loads the client CAs:
// nil for plaintext. Bad files are usage errors naming the flag and the
// file.
func loadTLS(cmd *cobra.Command, fl tlsFlags, listen string) (*tlsSource, error) {
	if err := checkClientCAFlags(cmd, fl); err != nil {
		return nil, err
	}
	src, err := serverTLS(cmd, fl, listen)
	if err != nil || fl.tlsClientCA == "" {
		return src, err
	}
	if src == nil {
		return nil, usagef("invalid --tls-client-ca %q: needs TLS: --tls-cert and --tls-key, or --tls-self-signed (--secure-serving in GIE mode)", fl.tlsClientCA)
	}
	cas, err := picker.LoadClientCAs(fl.tlsClientCA)
	if err != nil {
		var cae *picker.ClientCAError
		if errors.As(err, &cae) {
			err = cae.Err
		}
		return nil, usagef("invalid --tls-client-ca %q: %v", fl.tlsClientCA, err)
	}
	src.cas, src.caFile, src.sans = cas, fl.tlsClientCA, fl.tlsClientSANs
	return src, nil
}

// checkClientCAFlags checks --tls-client-ca and --tls-client-san on their
// own: a file named, SANs only with it, each SAN an IP address, a URI as
// Go prints it (the form it is compared in), an email address or a DNS
// name; each is compared only with the client certificate's SANs of its
// form (picker.MutualTLSConfig).
func checkClientCAFlags(cmd *cobra.Command, fl tlsFlags) error {
	if cmd.Flags().Changed("tls-client-ca") && fl.tlsClientCA == "" {
		return usagef("invalid --tls-client-ca %q: must name a PEM file", fl.tlsClientCA)
	}
	for _, s := range fl.tlsClientSANs {
		if fl.tlsClientCA == "" {
			return usagef("invalid --tls-client-san %q: needs --tls-client-ca, the CAs that issue client certificates", s)
		}
		if s == "" || strings.ContainsFunc(s, func(r rune) bool { return r <= ' ' || r == 0x7f }) {
			return usagef("invalid --tls-client-san %q: want a DNS name, a URI such as spiffe://cluster.local/ns/gw/sa/envoy, an IP or an email address", s)
		}
		if _, err := netip.ParseAddr(s); err == nil {
			continue
		}
		if strings.Contains(s, ":") {
			u, err := url.Parse(s)
			if err != nil {
				return usagef("invalid --tls-client-san %q: %v", s, err)
			}
			if u.Scheme == "" || u.String() != s {
				return usagef("invalid --tls-client-san %q: want a URI in the form Go compares it, %q", s, u.String())
			}
		}
	}
	return nil
}

// serverTLS checks the server certificate flags and loads or makes the
// certificate: nil for plaintext.
func serverTLS(cmd *cobra.Command, fl tlsFlags, listen string) (*tlsSource, error) {
	for _, f := range []struct{ name, v string }{{"tls-cert", fl.tlsCert}, {"tls-key", fl.tlsKey}} {
		if cmd.Flags().Changed(f.name) && f.v == "" {
			return nil, usagef("invalid --%s %q: must name a PEM file", f.name, f.v)
		}
	}
	switch {
	case fl.tlsSelfSigned:
		cert, err := picker.SelfSigned(selfSignedHosts(listen), time.Now())
		if err != nil {
			return nil, err
		}
		return &tlsSource{self: &cert}, nil
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
	return &tlsSource{kp: kp, certFile: fl.tlsCert}, nil
}

// keyPairUsage rewrites a picker.KeyPairError as a usage error naming the
// flag at fault and its value.
func keyPairUsage(err error, fl tlsFlags) error {
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

// watch re-reads the certificate files (when not self-signed) and the
// client CA file (when set) every interval until ctx ends or the function
// it returns is called. A nil source watches nothing.
func (s *tlsSource) watch(ctx context.Context, interval time.Duration, logger *slog.Logger) (stop func()) {
	if s == nil || (s.kp == nil && s.cas == nil) {
		return func() {}
	}
	ctx, cancel := context.WithCancel(ctx)
	every := func(watch func(<-chan time.Time)) {
		tick := time.NewTicker(interval)
		go func() {
			defer tick.Stop()
			watch(tick.C)
		}()
	}
	if s.kp != nil {
		every(func(c <-chan time.Time) { watchKeyPair(ctx, s.kp, c, logger) })
	}
	if s.cas != nil {
		every(func(c <-chan time.Time) { watchClientCAs(ctx, s.cas, s.caFile, c, logger) })
	}
	return cancel
}

// watchKeyPair re-reads the certificate and key files at every tick until
// ctx ends (keyPairWatcher.reload).
func watchKeyPair(ctx context.Context, kp *picker.KeyPair, tick <-chan time.Time, logger *slog.Logger) {
	everyTick(ctx, tick, (&keyPairWatcher{kp: kp, logger: logger}).reload)
}

// everyTick calls f at every tick until ctx ends.
func everyTick(ctx context.Context, tick <-chan time.Time, f func()) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-tick:
			f()
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

// watchClientCAs re-reads the client CA file at every tick until ctx ends
// (clientCAWatcher.reload).
func watchClientCAs(ctx context.Context, cas *picker.ClientCAs, file string, tick <-chan time.Time, logger *slog.Logger) {
	everyTick(ctx, tick, (&clientCAWatcher{cas: cas, file: file, logger: logger}).reload)
}

// clientCAWatcher reloads ClientCAs and logs what came of it.
type clientCAWatcher struct {
	cas     *picker.ClientCAs
	file    string
	logger  *slog.Logger
	lastErr string
}

// reload re-reads the file. A change is logged; a failed reload is logged
// once per distinct error, naming the file, and the last good pool keeps
// verifying client certificates.
func (w *clientCAWatcher) reload() {
	changed, err := w.cas.Reload()
	switch {
	case err != nil:
		if err.Error() != w.lastErr {
			w.logger.Warn("TLS client CA file not reloaded; verifying client certificates with the previous CAs", "file", w.file, "err", err)
			w.lastErr = err.Error()
		}
		return
	case changed:
		w.logger.Info("TLS client CA file reloaded", "file", w.file, "certificates", w.cas.Len())
	}
	w.lastErr = ""
}
