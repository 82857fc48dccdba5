package picker

import (
	"crypto/x509"
	"net/netip"
	"strings"
)

// sanKind is the form of a subject alternative name.
type sanKind uint8

const (
	sanDNS sanKind = iota
	sanURI
	sanIP
	sanEmail
)

// allowedSAN is a name a client certificate may carry, with the one form
// of SAN it is compared with.
type allowedSAN struct {
	kind  sanKind
	value string
	ip    netip.Addr
}

// parseAllowedSAN takes the form of an allowed name from its text: an IP
// address is an IP SAN, a value with a colon (a scheme, as
// spiffe://cluster.local/ns/gw/sa/envoy) a URI SAN, one with an @ an email
// SAN, anything else a DNS SAN. A name is compared only with the SANs of
// its form, so that a certificate whose DNS SAN spells a SPIFFE ID does
// not pass for that ID.
func parseAllowedSAN(s string) allowedSAN {
	if ip, err := netip.ParseAddr(s); err == nil {
		return allowedSAN{kind: sanIP, value: s, ip: ip.Unmap()}
	}
	switch {
	case strings.Contains(s, ":"):
		return allowedSAN{kind: sanURI, value: s}
	case strings.Contains(s, "@"):
		return allowedSAN{kind: sanEmail, value: s}
	}
	return allowedSAN{kind: sanDNS, value: s}
}

// matches reports whether leaf carries a's name as a SAN of a's form: a
// DNS name compared without regard to case (DNS names are
// case-insensitive), a URI as Go prints it, an IP address by value, an
// email address exactly.
func (a allowedSAN) matches(leaf *x509.Certificate) bool {
	switch a.kind {
	case sanURI:
		for _, u := range leaf.URIs {
			if u.String() == a.value {
				return true
			}
		}
	case sanIP:
		for _, ip := range leaf.IPAddresses {
			if b, ok := netip.AddrFromSlice(ip); ok && b.Unmap() == a.ip {
				return true
			}
		}
	case sanEmail:
		for _, e := range leaf.EmailAddresses {
			if e == a.value {
				return true
			}
		}
	default:
		for _, d := range leaf.DNSNames {
			if strings.EqualFold(d, a.value) {
				return true
			}
		}
	}
	return false
}

// sanNames lists leaf's SANs of every form, for an error message.
func sanNames(leaf *x509.Certificate) []string {
	names := append([]string(nil), leaf.DNSNames...)
	for _, u := range leaf.URIs {
		names = append(names, u.String())
	}
	for _, ip := range leaf.IPAddresses {
		names = append(names, ip.String())
	}
	return append(names, leaf.EmailAddresses...)
}
