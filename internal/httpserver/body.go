package httpserver

import (
	"io"
	"net/http"
	"sync"
)

// body is a request body: it sends 100 Continue before the first read
// when the client asked for it, and notes its end for the disconnect
// watch. Close reads up to maxPostHandlerRead bytes of the rest, as
// net/http's server does, so that the connection can be kept. Once the
// handler has returned, Read fails with http.ErrBodyReadAfterClose: the
// rest of the connection belongs to the server (a goroutine the handler
// left behind must not read the next request).
type body struct {
	c  *conn
	w  *response
	rc io.ReadCloser

	// mu is held during a read, as net/http does, so that the server
	// waits for a read in progress when the handler returns.
	mu                      sync.Mutex
	expect100, sentContinue bool
	eof, closed             bool
	readEOF                 bool  // the handler's Read met the end
	returned                bool  // the handler returned
	n                       int64 // bytes read
}

func newBody(c *conn, w *response, rc io.ReadCloser, expect100 bool) *body {
	return &body{c: c, w: w, rc: rc, expect100: expect100}
}

func (b *body) Read(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed || b.returned {
		return 0, http.ErrBodyReadAfterClose
	}
	if b.eof {
		return 0, io.EOF
	}
	if b.expect100 && !b.sentContinue {
		b.sentContinue = true
		b.w.continueMu.Lock()
		if !b.w.noContinue {
			_, _ = b.c.bw.WriteString("HTTP/1.1 100 Continue\r\n\r\n")
			_ = b.c.bw.Flush()
		}
		b.w.continueMu.Unlock()
	}
	n, err := b.readLocked(p)
	if err == io.EOF {
		b.readEOF = true
	}
	return n, err
}

// readLocked reads from the request body and notes its end. b.mu is held.
func (b *body) readLocked(p []byte) (int, error) {
	n, err := b.rc.Read(p)
	b.n += int64(n)
	if err == io.ErrUnexpectedEOF {
		// net/http's body counts a Content-Length body the client cut
		// short as ended (a chunked one not): it then reads io.EOF.
		if _, e := b.rc.Read(nil); e == io.EOF {
			b.endLocked()
		}
	}
	if err == io.EOF {
		b.endLocked()
	}
	return n, err
}

// endLocked notes the end of the body. b.mu is held.
func (b *body) endLocked() {
	b.eof = true
	b.c.mu.Lock()
	b.c.bodyDone = true
	b.c.pipelined = b.c.br.Buffered() > 0
	b.c.maybeWatchLocked()
	b.c.mu.Unlock()
}

// discardLocked reads and drops up to max bytes of the body and returns
// how many it read and the error that stopped it (nil: max bytes were
// read, io.EOF: the body ended). b.mu is held.
func (b *body) discardLocked(max int64) (int64, error) {
	if b.eof {
		return 0, io.EOF
	}
	return io.CopyN(io.Discard, lockedReader{b}, max)
}

// lockedReader reads a body whose mu is held.
type lockedReader struct{ b *body }

func (r lockedReader) Read(p []byte) (int, error) { return r.b.readLocked(p) }

// unreadLocked reports whether bytes of the body may be left unread. b.mu
// is held.
func (b *body) unreadLocked() bool {
	return !b.eof && (b.w.req.ContentLength < 0 || b.n < b.w.req.ContentLength)
}

// Close ends the handler's use of the body. Like net/http's server, it
// reads up to maxPostHandlerRead bytes of the rest (unless the declared
// length says there is more), so that the connection may be kept, and
// returns the error that reading met. It does not send a 100 Continue: a
// client waiting for one sends the body after its own timeout (one second
// for Go's and curl's) or Close waits up to the ReadTimeout, as with
// net/http.
func (b *body) Close() error {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed || b.returned {
		return nil
	}
	b.closed = true
	if !b.unreadLocked() {
		return nil
	}
	if b.w.req.Close && len(b.w.req.TransferEncoding) == 0 {
		return nil // no trailer to read, and the connection closes next
	}
	if cl := b.w.req.ContentLength; cl >= 0 && cl-b.n > maxPostHandlerRead {
		return nil
	}
	if _, err := b.discardLocked(maxPostHandlerRead); err != nil && err != io.EOF {
		return err // as net/http's: a bad chunk, a timeout
	}
	return nil
}

// handlerReturned ends the handler's use of the body (waiting for a read
// in progress) and reports whether bytes of it may be left unread.
func (b *body) handlerReturned() (unread bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.returned = true
	return b.unreadLocked()
}

// settle is called as the response head is written on a connection that
// is to be kept: it reads the rest of the body the handler left and
// closes the body (later reads fail), as net/http's server does, and
// reports whether the connection can be kept: not when the client was to
// send the body after a 100 Continue, when the handler closed the body
// early, when reading fails, or when more than maxPostHandlerRead bytes
// are left (tooBig).
func (b *body) settle() (keep, tooBig bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.expect100 {
		// The client may not have sent the body (the connection could
		// not be trusted); net/http keeps it only once the handler has
		// read the body to its end.
		return b.readEOF, false
	}
	if b.closed && b.unreadLocked() {
		return false, false
	}
	if cl := b.w.req.ContentLength; cl >= 0 && cl-b.n >= maxPostHandlerRead {
		return false, true
	}
	switch _, err := b.discardLocked(maxPostHandlerRead + 1); err {
	case nil:
		return false, true
	case io.EOF:
		// The body is done with: later reads fail, as with net/http.
		b.closed = true
		return true, false
	default:
		return false, false // a timeout, a bad chunk: the rest cannot be trusted
	}
}
