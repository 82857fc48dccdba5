package httpserver

import (
	"errors"
	"net"
	"time"
)

// delayPassed starts the disconnect watch if the handler still runs and
// the body has been read.
func (c *conn) delayPassed() {
	c.mu.Lock()
	if c.handlerDone {
		c.mu.Unlock()
		return
	}
	c.watchWanted = true
	c.maybeWatchLocked()
	c.mu.Unlock()
}

// maybeWatchLocked starts the background read when it is wanted and
// possible. c.mu is held.
func (c *conn) maybeWatchLocked() {
	if !c.watchWanted || !c.bodyDone || c.pipelined || c.watching || c.handlerDone {
		return
	}
	c.watching = true
	c.watchDone = make(chan struct{})
	go c.watch(c.watchDone)
}

// watch reads the connection while the handler runs: a read error other
// than the interruption means the client has gone, and cancels the
// request's context; a byte read (the next pipelined request) is handed to
// the next request's read.
func (c *conn) watch(done chan struct{}) {
	defer close(done)
	var b [1]byte
	for {
		n, err := c.nc.Read(b[:])
		c.mu.Lock()
		if n == 1 {
			c.r.hasByte, c.r.b = true, b[0]
			c.mu.Unlock()
			return
		}
		var ne net.Error
		if errors.As(err, &ne) && ne.Timeout() {
			if c.stopping {
				c.mu.Unlock()
				return
			}
			// A deadline left in place (idle, read) has passed during
			// a long request: lift it and go on watching.
			c.setReadDeadline(time.Time{})
			c.mu.Unlock()
			continue
		}
		if err != nil {
			c.gone = true
			c.cancel()
		}
		c.mu.Unlock()
		return
	}
}
