package config

import (
	"fmt"
	"strings"
)

// MaxPeers is the longest peer list a model may have.
const MaxPeers = 64

// ValidatePeers checks a model's peer list ([Model.Peers]): at most
// [MaxPeers] entries, each a base URL as [ValidateAddress] accepts (a bare
// host:port means http://), listed once (ignoring a trailing slash and the
// case of the scheme and host). The error is a [*FieldError] for field
// "peers[i]" (or "peers" when the list is too long).
func ValidatePeers(peers []string) error {
	if len(peers) > MaxPeers {
		return &FieldError{Field: "peers", Value: fmt.Sprintf("%d peers", len(peers)), Reason: fmt.Sprintf("at most %d", MaxPeers)}
	}
	seen := make(map[string]int, len(peers))
	for i, p := range peers {
		at := fmt.Sprintf("peers[%d]", i)
		if err := ValidateAddress(p); err != nil {
			fe := err.(*FieldError)
			fe.Field = at
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

// peerKey is a valid peer address in a form where two spellings of one
// base URL are equal: scheme and host in lower case, http:// when left
// out, no trailing slash.
func peerKey(addr string) string {
	scheme, rest, ok := strings.Cut(addr, "://")
	if !ok {
		scheme, rest = "http", addr
	}
	host, path, _ := strings.Cut(rest, "/")
	return strings.ToLower(scheme) + "://" + strings.ToLower(host) + "/" + strings.TrimRight(path, "/")
}
