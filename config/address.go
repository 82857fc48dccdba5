package config

import (
	"errors"
	"net/url"
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// ValidateAddress reports whether addr can be a replica's address: an
// http:// or https:// base URL (the scheme may be left out, meaning
// http://, as the HTTP gateway reads it) with a host, an optional port in
// 1..65535 and an optional path, and nothing else: no spaces or control
// characters, no credentials (user:password@), no query and no fragment.
// The error is a [*FieldError] for field "address" saying what is wrong.
func ValidateAddress(addr string) error {
	bad := func(reason string) error { return &FieldError{Field: "address", Value: addr, Reason: reason} }
	switch {
	case addr == "":
		return bad("must not be empty")
	case !utf8.ValidString(addr):
		return bad("must be valid UTF-8")
	case strings.ContainsFunc(addr, func(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }):
		return bad("must not contain spaces or control characters")
	}
	full := addr
	if scheme, _, ok := strings.Cut(addr, "://"); ok {
		if s := strings.ToLower(scheme); s != "http" && s != "https" {
			return bad("scheme " + strconv.Quote(scheme) + ", want http or https")
		}
	} else if scheme, rest, ok := strings.Cut(addr, ":"); ok && looksLikeScheme(scheme) && (rest == "" || rest[0] < '0' || rest[0] > '9') {
		// "file:/etc/passwd", "mailto:x": a scheme, not host:port.
		return bad("scheme " + strconv.Quote(scheme) + ", want http or https")
	} else {
		full = "http://" + addr
	}
	const want = "want an http:// or https:// URL such as http://10.0.0.1:8000"
	u, err := url.Parse(full)
	if ue := (*url.Error)(nil); errors.As(err, &ue) {
		return bad("not a valid URL (" + ue.Err.Error() + "); " + want)
	}
	if err != nil || u.Opaque != "" {
		return bad(want)
	}
	switch {
	case u.User != nil:
		return bad("must not contain credentials (user@ or user:password@)")
	case u.RawQuery != "" || u.ForceQuery || u.Fragment != "" || strings.Contains(full, "#"):
		return bad("must not have a query or fragment")
	case u.Hostname() == "":
		return bad("missing host; " + want)
	case strings.HasSuffix(u.Host, ":"):
		return bad("empty port after ':'")
	}
	if p := u.Port(); p != "" {
		n, err := strconv.Atoi(p)
		if err != nil || n < 1 || n > 65535 {
			return bad("port " + p + " out of range 1..65535")
		}
	}
	return nil
}

// looksLikeScheme reports whether s has the form of a URL scheme (RFC 3986
// §3.1): a letter, then letters, digits, '+', '-' or '.'.
func looksLikeScheme(s string) bool {
	if s == "" || !isASCIILetter(s[0]) {
		return false
	}
	for i := 1; i < len(s); i++ {
		c := s[i]
		if !isASCIILetter(c) && (c < '0' || c > '9') && c != '+' && c != '-' && c != '.' {
			return false
		}
	}
	return true
}

func isASCIILetter(c byte) bool { return c|0x20 >= 'a' && c|0x20 <= 'z' }
