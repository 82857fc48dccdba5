//go:build !unix

package httpclient

import "syscall"

// unread is conncheck_unix.go's check, which other systems do without: a
// connection the peer closed is then caught by RoundTrip's resend.
func unread(syscall.RawConn) bool { return false }
