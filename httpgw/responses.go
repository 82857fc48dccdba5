package httpgw

import (
	"bytes"
	"sync"
)

// The Responses API (POST /v1/responses) is routed as chat is, by the
// prefix key of its instructions and input (keys.Parse), with one rule of
// its own: an engine keeps a stored response only in its own memory
// (vLLM's store=true), so a request continuing a conversation
// (previous_response_id) must go to the replica that produced the
// response it continues, or the engine answers 404. The gateway learns
// each response's id from the head of its answer (the JSON object's "id",
// or the response.created event's response.id when streamed) and pins a
// continuation to that replica: it is routed there if healthy, and not
// retried elsewhere. A continuation whose id the gateway never saw (it
// restarted, or the id was forgotten) is routed by its key.
//
// Bounds: the gateway remembers the maxResponseIDs most recent ids
// (first in, first out): 12.1 MiB at the bound, 194 bytes an id of vLLM's
// shape (EXA_MEASURE=1 go test -run TestResponseIDsMemory -v ./httpgw).

// maxResponseIDs is how many response ids the gateway remembers.
const maxResponseIDs = 1 << 16

// maxResponseHead is how many leading bytes of an answer the gateway reads
// for its response id; an id past them is not learned.
const maxResponseHead = 4 << 10

// responseOwner is the replica that produced a response.
type responseOwner struct{ model, replica string }

// responseIDs remembers the replica of each recent response id. Safe for
// concurrent use; the zero value is empty.
type responseIDs struct {
	mu   sync.Mutex
	m    map[string]responseOwner
	ring []string // ids in the order learned; next is overwritten first
	next int
}

// add remembers that replica of model produced response id.
func (r *responseIDs) add(id, model, replica string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil {
		r.m = make(map[string]responseOwner)
		r.ring = make([]string, 0, 1024)
	}
	if _, ok := r.m[id]; ok {
		return
	}
	if len(r.ring) < maxResponseIDs {
		r.ring = append(r.ring, id)
	} else {
		delete(r.m, r.ring[r.next])
		r.ring[r.next] = id
		r.next = (r.next + 1) % maxResponseIDs
	}
	r.m[id] = responseOwner{model, replica}
}

// owner returns the replica of model that produced response id, if known.
func (r *responseIDs) owner(id, model string) (string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	o, ok := r.m[id]
	if !ok || o.model != model {
		return "", false
	}
	return o.replica, true
}

// responseID returns the id of the response whose answer begins with
// head: the first string member "id" whose value starts with "resp",
// within a JSON answer or an event stream; "" if head has none yet. An id
// longer than 256 bytes or holding an escape is not taken.
func responseID(head []byte) string {
	for rest := head; ; {
		i := bytes.Index(rest, []byte(`"id"`))
		if i < 0 {
			return ""
		}
		rest = rest[i+4:]
		v := bytes.TrimLeft(rest, " \t\r\n")
		if len(v) == 0 || v[0] != ':' {
			continue
		}
		v = bytes.TrimLeft(v[1:], " \t\r\n")
		if len(v) == 0 || v[0] != '"' {
			continue
		}
		v = v[1:]
		end := bytes.IndexByte(v, '"')
		if end < 0 || end > 256 || bytes.IndexByte(v[:end], '\\') >= 0 || !bytes.HasPrefix(v[:end], []byte("resp")) {
			continue
		}
		return string(v[:end])
	}
}

// learnResponse reads the head of a Responses API answer for its id and
// remembers the replica that produced it. Called with each chunk relayed
// until it returns true (learned, or the head is read).
func (s *Server) learnResponse(c *call, chunk []byte) bool {
	c.head = append(c.head, chunk[:min(len(chunk), maxResponseHead-len(c.head))]...)
	if id := responseID(c.head); id != "" {
		s.respIDs.add(id, c.ms.Name, c.attempt.d.Replica)
		c.head = nil
		return true
	}
	if len(c.head) >= maxResponseHead {
		c.head = nil
		return true
	}
	return false
}
