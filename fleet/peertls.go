package fleet

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"

	"github.com/examlops/gateway/internal/httpclient"
)

// Peer scrapes over https (docs/multi-gateway.md). A static https:// peer
// is verified as any https URL is, against its host. Each address of a
// dns+https://NAME:PORT entry is verified against NAME: every gateway
// behind the name presents one certificate naming it (a headless
// Service's name), which no pod IP would match. Options.PeerCAFile names
// the CAs trusted for both, in place of the system roots.

// maxPeerCABytes bounds a peer CA file (a whole system bundle is about
// 220 KB).
const maxPeerCABytes = 4 << 20

// ReadPeerCA reads a peer CA file (Options.PeerCAFile): one or more PEM
// CERTIFICATE blocks, each a certificate x509 parses, at most 4 MiB in
// all; text before or between blocks is skipped (comments). Any other
// block, a block that is not valid PEM, or text after the last block is
// an error naming the file (and the block).
func ReadPeerCA(path string) (*x509.CertPool, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("peer CA file: %w", err)
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxPeerCABytes+1))
	if err != nil {
		return nil, fmt.Errorf("peer CA file %s: %w", path, err)
	}
	if len(b) > maxPeerCABytes {
		return nil, fmt.Errorf("peer CA file %s: over %d bytes", path, maxPeerCABytes)
	}
	pool, err := parsePeerCA(b)
	if err != nil {
		return nil, fmt.Errorf("peer CA file %s: %w", path, err)
	}
	return pool, nil
}

// parsePeerCA parses PEM CERTIFICATE blocks into a pool (ReadPeerCA).
func parsePeerCA(b []byte) (*x509.CertPool, error) {
	pool := x509.NewCertPool()
	// pem.Decode passes over a block it cannot decode to the next one:
	// every "-----BEGIN" must be a block decoded.
	begins := bytes.Count(b, []byte("-----BEGIN"))
	n := 0
	for {
		var blk *pem.Block
		blk, b = pem.Decode(b)
		if blk == nil {
			break
		}
		n++
		if blk.Type != "CERTIFICATE" {
			return nil, fmt.Errorf("block %d is %q, want CERTIFICATE", n, blk.Type)
		}
		c, err := x509.ParseCertificate(blk.Bytes)
		if err != nil {
			return nil, fmt.Errorf("block %d: %v", n, err)
		}
		pool.AddCert(c)
	}
	switch {
	case n == 0:
		return nil, fmt.Errorf("no PEM certificate")
	case len(strings.TrimSpace(string(b))) > 0:
		return nil, fmt.Errorf("text after block %d is not PEM", n)
	case begins != n:
		return nil, fmt.Errorf("%d of %d blocks are not valid PEM", begins-n, begins)
	}
	return pool, nil
}

// peerTLS holds the clients of peer scrapes over https that differ from
// the control client: one per server name ("" verifies the URL's host),
// built with the last good PeerCAFile. Safe for concurrent use; the zero
// value has none.
type peerTLS struct {
	file fileCache[*x509.CertPool] // PeerCAFile (ReadPeerCA)

	mu      sync.Mutex
	ca      *x509.CertPool // the file's, which clients were built with; nil: the system roots
	failing bool           // the file was last found unreadable (logged once)
	clients map[string]*http.Client
}

// refreshPeerCA re-reads Options.PeerCAFile if its size or modification
// time changed since it was last read. A file that no longer reads keeps
// the last CAs, logged when it starts failing and when it reads again
// (or is back as it was last read). New CAs drop the clients built with
// the old ones.
func (s *Fleet) refreshPeerCA() {
	if s.opts.PeerCAFile == "" {
		return
	}
	t := &s.peers.tls
	t.mu.Lock()
	was := t.failing
	t.mu.Unlock()
	err := s.loadPeerCA()
	switch {
	case err != nil && !was:
		s.log.Warn("gateway: peer CA file unreadable; keeping the last CAs read", "err", err)
	case err == nil && was:
		s.log.Info("gateway: peer CA file read again", "file", s.opts.PeerCAFile)
	}
}

// loadPeerCA reads Options.PeerCAFile into s.peers.tls unless its size
// and modification time are those of its last good read, and records
// whether it failed.
func (s *Fleet) loadPeerCA() error {
	t := &s.peers.tls
	pool, changed, err := t.file.get(s.opts.PeerCAFile, "peer CA file", ReadPeerCA, (*x509.CertPool).Equal)
	t.mu.Lock()
	defer t.mu.Unlock()
	t.failing = err != nil
	if changed {
		t.ca = pool
		t.closeClients()
	}
	return err
}

// peerClient returns the client that scrapes base, verifying name when
// base is an https URL and name is not "": the control client for plain
// http, and for https when neither a server name nor a PeerCAFile
// applies; otherwise a client of its own per name, trusting PeerCAFile's
// CAs.
func (s *Fleet) peerClient(base, name string) *http.Client {
	if !strings.HasPrefix(base, "https://") || (name == "" && s.opts.PeerCAFile == "") {
		return s.control
	}
	t := &s.peers.tls
	t.mu.Lock()
	defer t.mu.Unlock()
	if c := t.clients[name]; c != nil {
		return c
	}
	if t.clients == nil {
		t.clients = map[string]*http.Client{}
	}
	c := &http.Client{Transport: peerTransport(s.opts.Transport, t.ca, name), CheckRedirect: noRedirect, Timeout: s.opts.ProbeTimeout}
	t.clients[name] = c
	return c
}

// keepOnly drops the clients of server names other than "" and names'
// values (the names of the dns+https entries configured), closing their
// idle connections.
func (t *peerTLS) keepOnly(names map[string]string) {
	t.mu.Lock()
	defer t.mu.Unlock()
	keep := make(map[string]bool, len(names))
	for _, n := range names {
		keep[n] = true
	}
	for name, c := range t.clients {
		if name != "" && !keep[name] {
			c.CloseIdleConnections()
			delete(t.clients, name)
		}
	}
}

// close drops every client, closing its idle connections (Fleet.Close).
func (t *peerTLS) close() {
	t.mu.Lock()
	defer t.mu.Unlock()
	t.closeClients()
}

// closeClients drops every client, closing its idle connections. t.mu is
// held.
func (t *peerTLS) closeClients() {
	for name, c := range t.clients {
		c.CloseIdleConnections()
		delete(t.clients, name)
	}
}

// peerTransport returns a transport like base (a clone when it is an
// *http.Transport; otherwise httpclient's, which the default Pool uses
// for https too) whose TLS trusts ca (nil: the system roots, or base's
// own) and verifies name (when not "").
func peerTransport(base http.RoundTripper, ca *x509.CertPool, name string) *http.Transport {
	var t *http.Transport
	if b, ok := base.(*http.Transport); ok {
		t = b.Clone()
	} else {
		t = httpclient.NewTransport(0)
	}
	cfg := &tls.Config{}
	if t.TLSClientConfig != nil {
		cfg = t.TLSClientConfig.Clone()
	}
	if ca != nil {
		cfg.RootCAs = ca
	}
	if name != "" {
		cfg.ServerName = name
	}
	cfg.MinVersion = max(cfg.MinVersion, tls.VersionTLS12)
	t.TLSClientConfig = cfg
	return t
}
