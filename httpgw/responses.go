package httpgw

import "github.com/examlops/gateway/internal/front"

// The Responses API (POST /v1/responses) is routed as chat is, by the
// prefix key of its instructions and input (keys.Parse). A request
// continuing a conversation (previous_response_id) goes to the replica
// that produced the response it continues (front.ResponseIDs, learned
// from the head of each answer by front.ResponseHead; bounds there): it
// is routed there if healthy, and not retried elsewhere; if that replica
// is not eligible, the client gets 503. A continuation whose id the
// gateway never saw (it restarted, or the id was forgotten) is routed by
// its key. The table counts each id against the client's address
// (front.ClientOf of the connection's remote address), so that one client
// cannot make it forget another's.

// learnResponse reads the head of a Responses API answer for its id and
// remembers the replica that produced it. Called with each chunk relayed
// until it returns true (learned, or the head is read).
func (s *Server) learnResponse(c *call, chunk []byte) bool {
	id, done := c.head.Feed(chunk)
	if id != "" {
		s.respIDs.Add(id, c.ms.Name, c.attempt.d.Replica, front.ClientOf(c.r.RemoteAddr))
	}
	return done
}
