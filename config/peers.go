package config

import (
	"fmt"
	"strings"
)

// MaxPeers is the longest peer list a model may have.
const MaxPeers = 64

// DNSPeerPrefix marks a peer entry that names a DNS name whose addresses
// are the peers: "dns+http://NAME:PORT" is every address NAME resolves to
// (as a Kubernetes headless Service's name resolves to its ready pods), at
// PORT, looked up again every scrape interval. "dns+https://NAME:PORT" is
// the same over HTTPS, each address's certificate verified for NAME (the
// certificate every gateway behind the name presents), not for the
// address. A gateway that finds itself among them ignores itself, so
// every gateway of a group can share one list.
const DNSPeerPrefix = "dns+"

// ValidatePeers checks a model's peer list ([Model.Peers]): at most
// [MaxPeers] entries, each a base URL as [ValidateAddress] accepts (a bare
// host:port means http://), or [DNSPeerPrefix] and an http:// or https:// URL,
// listed once (ignoring a trailing slash and the case of the scheme and
// host). The error is a [*FieldError] for field "peers[i]" (or "peers"
// when the list is too long).
func ValidatePeers(peers []string) error {
	if len(peers) > MaxPeers {
		return &FieldError{Field: "peers", Value: fmt.Sprintf("%d peers", len(peers)), Reason: fmt.Sprintf("at most %d", MaxPeers)}
	}
	seen := make(map[string]int, len(peers))
	for i, p := range peers {
		at := fmt.Sprintf("peers[%d]", i)
		addr, dns := CutDNSPeer(p)
		if l := strings.ToLower(addr); dns && !strings.HasPrefix(l, "http://") && !strings.HasPrefix(l, "https://") {
			return &FieldError{Field: at, Value: p, Reason: "a dns+ peer must be dns+http://NAME:PORT or dns+https://NAME:PORT"}
		}
		if err := ValidateAddress(addr); err != nil {
			fe := err.(*FieldError)
			fe.Field, fe.Value = at, p
			return fe
		}
		k := peerKey(p)
		if j, ok := seen[k]; ok {
			return &FieldError{Field: at, Value: p, Reason: fmt.Sprintf("the same gateway as peers[%d]", j)}
		}
		seen[k] = i
	}
	return nil
}

// CutDNSPeer returns a peer entry without its [DNSPeerPrefix] (in any
// case), and whether it had it.
func CutDNSPeer(p string) (string, bool) {
	if len(p) >= len(DNSPeerPrefix) && strings.EqualFold(p[:len(DNSPeerPrefix)], DNSPeerPrefix) {
		return p[len(DNSPeerPrefix):], true
	}
	return p, false
}

// peerKey is a valid peer address in a form where two spellings of one
// base URL are equal: scheme and host in lower case, http:// when left
// out, no trailing slash.
func peerKey(addr string) string {
	dns := ""
	if rest, ok := CutDNSPeer(addr); ok {
		dns, addr = DNSPeerPrefix, rest
	}
	scheme, rest, ok := strings.Cut(addr, "://")
	if !ok {
		scheme, rest = "http", addr
	}
	host, path, _ := strings.Cut(rest, "/")
	return dns + strings.ToLower(scheme) + "://" + strings.ToLower(host) + "/" + strings.TrimRight(path, "/")
}
