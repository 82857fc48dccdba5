package httpserver

import "time"

// watchdogIdleTicks is how many checks without requests stop the
// disconnect-check ticker until the next request.
const watchdogIdleTicks = 50

func (s *Server) stopWatchdog() { s.quitOnce.Do(func() { close(s.wdQuit) }) }

// watchdog starts the disconnect watch of requests that have run for
// DisconnectCheckDelay. It ticks while requests come in (one goroutine
// wake-up per DisconnectCheckDelay, however many requests) and sleeps
// after watchdogIdleTicks ticks without any, until a request wakes it.
func (s *Server) watchdog() {
	d := s.opts.DisconnectCheckDelay
	var due []*conn
	for {
		select {
		case <-s.wdWake:
		case <-s.wdQuit:
			return
		}
		t := time.NewTicker(d)
		last := s.reqs.Load()
		for idle := 0; ; {
			select {
			case <-t.C:
			case <-s.wdQuit:
				t.Stop()
				return
			}
			var busy bool
			due, busy = s.dueConns(d, due[:0])
			for i, c := range due {
				c.delayPassed()
				due[i] = nil
			}
			n := s.reqs.Load()
			if busy || n != last {
				idle = 0
			} else if idle++; idle >= watchdogIdleTicks {
				s.wdRunning.Store(false)
				// A request read since the last check saw the ticker
				// running and did not wake it: go on ticking.
				if s.reqs.Load() == n || !s.wdRunning.CompareAndSwap(false, true) {
					break
				}
				idle = 0
			}
			last = n
		}
		t.Stop()
	}
}

// dueConns appends the connections whose request has run for at least d
// and reports whether any request is in flight.
func (s *Server) dueConns(d time.Duration, due []*conn) ([]*conn, bool) {
	now := int64(time.Since(s.epoch))
	busy := false
	s.mu.Lock()
	defer s.mu.Unlock()
	for c := range s.conns {
		if since := c.busySince.Load(); since != 0 {
			busy = true
			if now-since >= int64(d) {
				due = append(due, c)
			}
		}
	}
	return due, busy
}

// requestStarted notes a request for the disconnect check.
func (s *Server) requestStarted(c *conn) {
	if s.opts.DisconnectCheckDelay < 0 {
		c.delayPassed()
		return
	}
	c.busySince.Store(int64(time.Since(s.epoch)) + 1)
	s.reqs.Add(1)
	if !s.wdRunning.Load() && s.wdRunning.CompareAndSwap(false, true) {
		select {
		case s.wdWake <- struct{}{}:
		default:
		}
	}
}
