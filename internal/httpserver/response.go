package httpserver

import (
	"fmt"
	"net/http"
	"net/textproto"
	"strconv"
	"strings"
	"sync"
	"time"

	"golang.org/x/net/http/httpguts"
)

// pendMax is how much of a response body is held back before the head is
// sent, so that a short answer gets a Content-Length (net/http's
// bufferBeforeChunkingSize).
const pendMax = 2048

// response is the http.ResponseWriter (and http.Flusher) of a request.
type response struct {
	c    *conn
	req  *http.Request
	body *body // nil when the request has none
	// header is the handler's header map; sent is its copy as of
	// WriteHeader, taken when the handler asks for the map again before
	// the head is written (changes after WriteHeader have no effect, as
	// with net/http); nil means header.
	header           http.Header
	sent             http.Header
	status           int
	wroteHead        bool // the status line and header are written
	handlerDone      bool
	chunked          bool
	noBody           bool
	contentLength    int64 // -1 until known
	written          int64 // body bytes accepted (held back or sent)
	headWritten      int64 // bytes a HEAD handler wrote (not sent)
	wantsClose       bool  // the request asks to close the connection
	wants10KeepAlive bool  // an HTTP/1.0 request asks to keep it
	closeAfter       bool
	keepAlive10      bool  // the head says Connection: keep-alive
	err              error // write failure: the connection is closed after

	// continueMu orders the 100 Continue that a read of an Expect:
	// 100-continue body sends, from whatever goroutine, with the
	// response's own writes; noContinue, guarded by it, is set once the
	// final head is being written (no 100 Continue after it), as
	// net/http's writeContinueMu does.
	continueMu sync.Mutex
	noContinue bool
}

var _ http.Flusher = (*response)(nil)

// Header returns the response header map.
func (w *response) Header() http.Header {
	if w.status != 0 && !w.wroteHead && w.sent == nil {
		w.sent = w.header.Clone()
	}
	return w.header
}

// WriteHeader records the status; 1xx statuses are sent at once.
func (w *response) WriteHeader(code int) {
	if w.wroteHead || w.status != 0 {
		return
	}
	if code < 100 || code > 999 { // a handler bug: net/http panics too; runHandler recovers
		panic(fmt.Sprintf("invalid WriteHeader code %v", code))
	}
	if code >= 100 && code < 200 && code != http.StatusSwitchingProtocols {
		// An interim response has no body: the final response's framing
		// fields are not its own.
		if w.expect100() {
			w.continueMu.Lock()
			defer w.continueMu.Unlock()
		}
		w.writeStatusLine(code)
		w.writeFields(w.header)
		_, _ = w.c.bw.WriteString("\r\n")
		w.flushConn()
		return
	}
	w.status = code
	if cl := w.header.Get("Content-Length"); cl != "" {
		if v, err := strconv.ParseInt(cl, 10, 64); err == nil && v >= 0 {
			w.contentLength = v
		}
	}
	if !bodyAllowed(code) || w.req.Method == http.MethodHead {
		w.noBody = true
	}
}

func bodyAllowed(status int) bool {
	return !(status >= 100 && status <= 199 || status == http.StatusNoContent || status == http.StatusNotModified)
}

// Write writes body bytes, holding back up to pendMax of them before the
// head is sent.
func (w *response) Write(p []byte) (int, error) {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	if len(p) == 0 {
		return 0, nil // as net/http, whatever the status
	}
	if w.noBody {
		if w.req.Method == http.MethodHead && bodyAllowed(w.status) {
			// Not sent, but counted: a short answer's length is
			// announced, and a declared one holds, as with net/http.
			if w.contentLength >= 0 && w.headWritten+int64(len(p)) > w.contentLength {
				return 0, http.ErrContentLength
			}
			w.headWritten += int64(len(p))
			if !w.wroteHead && w.headWritten > pendMax {
				w.writeHead()
			}
			return len(p), nil
		}
		return 0, http.ErrBodyNotAllowed
	}
	if w.err != nil {
		return 0, w.err
	}
	if w.contentLength >= 0 && w.written+int64(len(p)) > w.contentLength {
		return 0, http.ErrContentLength
	}
	if !w.wroteHead {
		if len(w.c.pend)+len(p) <= pendMax {
			w.c.pend = append(w.c.pend, p...)
			w.written += int64(len(p))
			return len(p), nil
		}
		w.writeHead()
		if w.err != nil {
			return 0, w.err
		}
	}
	w.written += int64(len(p))
	if err := w.writeBody(p); err != nil {
		return 0, err
	}
	return len(p), nil
}

// writeBody sends body bytes, in a chunk when the response is chunked.
func (w *response) writeBody(p []byte) error {
	if len(p) == 0 {
		return nil
	}
	bw := w.c.bw
	var err error
	if w.chunked {
		var num [20]byte
		_, _ = bw.Write(strconv.AppendInt(num[:0], int64(len(p)), 16))
		_, _ = bw.WriteString("\r\n")
		_, _ = bw.Write(p)
		_, err = bw.WriteString("\r\n")
	} else {
		_, err = bw.Write(p)
	}
	if err != nil && w.err == nil {
		w.err = err
	}
	return err
}

// WriteString is Write for a string.
func (w *response) WriteString(s string) (int, error) { return w.Write([]byte(s)) }

// Flush sends the head and everything written so far to the client. A
// body of unknown length is chunked from then on.
func (w *response) Flush() { _ = w.FlushError() }

// FlushError is Flush reporting a write failure (http.ResponseController
// uses it).
func (w *response) FlushError() error {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	if !w.wroteHead {
		w.writeHead()
	}
	w.flushConn()
	return w.err
}

func (w *response) flushConn() {
	if err := w.c.bw.Flush(); err != nil && w.err == nil {
		w.err = err
	}
}

// finish completes the response after the handler returned.
func (w *response) finish() {
	if w.status == 0 {
		w.WriteHeader(http.StatusOK)
	}
	w.handlerDone = true
	if !w.wroteHead {
		w.writeHead()
	}
	if w.chunked && w.err == nil {
		_, _ = w.c.bw.WriteString("0\r\n\r\n")
	}
	if !w.noBody && w.contentLength >= 0 && w.written != w.contentLength {
		w.closeAfter = true // the client waits for bytes that will not come
	}
	w.flushConn()
}

// writeStatusLine writes the status line for code; the usual 200 is a
// constant. An HTTP/1.0 request gets an HTTP/1.0 answer, as with net/http.
func (w *response) writeStatusLine(code int) {
	proto := "HTTP/1.1 "
	if !w.req.ProtoAtLeast(1, 1) {
		proto = "HTTP/1.0 "
	}
	if code == http.StatusOK {
		_, _ = w.c.bw.WriteString(proto + "200 OK\r\n")
		return
	}
	text := http.StatusText(code)
	if text == "" {
		text = "status code " + strconv.Itoa(code)
	}
	_, _ = w.c.bw.WriteString(proto + strconv.Itoa(code) + " " + text + "\r\n")
}

// writeHead decides the framing of the response and whether the
// connection outlives it, as net/http's server does, then writes the
// status line and header fields, then the body bytes held back.
func (w *response) writeHead() {
	if w.expect100() {
		w.continueMu.Lock()
		w.noContinue = true
		w.continueMu.Unlock()
	}
	w.wroteHead = true
	h := w.header
	if w.sent != nil {
		h = w.sent
	}
	isHead := w.req.Method == http.MethodHead
	if w.handlerDone && w.contentLength < 0 && bodyAllowed(w.status) {
		// Everything was held back: its length is known. (A HEAD
		// handler that wrote nothing may not know it: none is sent.)
		if !isHead {
			w.contentLength = int64(len(w.c.pend))
		} else if w.headWritten > 0 {
			w.contentLength = w.headWritten
		}
	}
	hasCL := w.contentLength >= 0
	switch {
	case w.wants10KeepAlive && (isHead || hasCL || !bodyAllowed(w.status)):
		w.keepAlive10 = true
	case !w.req.ProtoAtLeast(1, 1) || w.wantsClose:
		w.closeAfter = true
	}
	if hasCloseToken(h["Connection"]) || w.c.s.shutdown.Load() {
		w.closeAfter = true
	}
	if !w.closeAfter && w.body != nil && w.req.ContentLength != 0 {
		// Read the rest of the body the handler left now, before the
		// answer, or close the connection after it.
		if keep, tooBig := w.body.settle(); !keep {
			w.closeAfter = true
			if tooBig {
				w.c.lingerClose = true
			}
		}
	}
	if w.c.ambiguous {
		// After the body is settled, so that the handler sees what it
		// would see from net/http.
		w.closeAfter = true
	}
	framed := !w.noBody && !hasCL
	if framed && w.req.ProtoAtLeast(1, 1) {
		w.chunked = true
	} else if framed {
		w.closeAfter = true // HTTP/1.0 without a length: the close ends the body
	}
	if w.closeAfter {
		w.keepAlive10 = false
	}

	bw := w.c.bw
	w.writeStatusLine(w.status)
	w.writeFields(h)
	var num [20]byte
	if hasCL && bodyAllowed(w.status) {
		_, _ = bw.WriteString("Content-Length: ")
		_, _ = bw.Write(strconv.AppendInt(num[:0], w.contentLength, 10))
		_, _ = bw.WriteString("\r\n")
	}
	if w.chunked {
		_, _ = bw.WriteString("Transfer-Encoding: chunked\r\n")
	}
	switch {
	case w.closeAfter && w.req.ProtoAtLeast(1, 1):
		_, _ = bw.WriteString("Connection: close\r\n")
	case w.keepAlive10:
		_, _ = bw.WriteString("Connection: keep-alive\r\n")
	}
	if _, ok := h["Date"]; !ok {
		_, _ = bw.WriteString("Date: ")
		var date [len(http.TimeFormat) + 8]byte
		_, _ = bw.Write(time.Now().UTC().AppendFormat(date[:0], http.TimeFormat))
		_, _ = bw.WriteString("\r\n")
	}
	if _, err := bw.WriteString("\r\n"); err != nil {
		w.err = err
		return
	}
	if len(w.c.pend) > 0 {
		_ = w.writeBody(w.c.pend)
		w.c.pend = w.c.pend[:0]
	}
}

// expect100 reports whether a read of the request body may send a 100
// Continue.
func (w *response) expect100() bool { return w.body != nil && w.body.expect100 }

// hasCloseToken reports whether Connection field values list "close".
func hasCloseToken(vv []string) bool {
	for _, v := range vv {
		for tok := range strings.SplitSeq(v, ",") {
			if strings.EqualFold(strings.TrimSpace(tok), "close") {
				return true
			}
		}
	}
	return false
}

// writeFields writes the handler's header fields but the framing ones,
// which are the server's own, as net/http does: a field whose name is not
// a valid token is dropped, and CR or LF in a value becomes a space, so
// that a handler cannot add fields or end the head.
func (w *response) writeFields(h http.Header) {
	bw := w.c.bw
	for k, vv := range h {
		switch k {
		case "Content-Length", "Transfer-Encoding", "Connection":
			continue
		}
		if !httpguts.ValidHeaderFieldName(k) {
			continue
		}
		if w.status == http.StatusNotModified && k == "Content-Type" {
			continue
		}
		for _, v := range vv {
			_, _ = bw.WriteString(k)
			_, _ = bw.WriteString(": ")
			if strings.ContainsAny(v, "\r\n") {
				v = strings.NewReplacer("\r", " ", "\n", " ").Replace(v)
			}
			_, _ = bw.WriteString(textproto.TrimString(v))
			_, _ = bw.WriteString("\r\n")
		}
	}
}
