//go:build unix

package httpclient

import "syscall"

// unread reports whether the socket raw has something to read: bytes
// nobody asked for, or the peer's close or reset. It peeks without
// waiting (Go's sockets do not block) and takes nothing; a check it cannot
// make reports false.
func unread(raw syscall.RawConn) bool {
	var buf [1]byte
	var n int
	var err error
	if rerr := raw.Read(func(fd uintptr) bool {
		n, _, err = syscall.Recvfrom(int(fd), buf[:], syscall.MSG_PEEK)
		return true
	}); rerr != nil {
		return true // the connection is closed
	}
	if err == syscall.EAGAIN || err == syscall.EWOULDBLOCK || err == syscall.EINTR {
		return false
	}
	return err != nil || n >= 0 // an error, bytes, or 0 at the peer's close
}
