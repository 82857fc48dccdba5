package front

import (
	"bytes"
	"sync"
)

// The Responses API (POST /v1/responses) is routed as chat is, by the
// prefix key of its instructions and input (keys.Parse), with one rule of
// its own: an engine keeps a stored response only in its own memory
// (vLLM's store=true), so a request continuing a conversation
// (previous_response_id) must go to the replica that produced the
// response it continues, or the engine answers 404. Both fronts learn
// each response's id from the head of its answer (ResponseHead: the JSON
// object's "id", or the response.created event's response.id when
// streamed) into their ResponseIDs, and pin a continuation to that
// replica (each front says what it does when the replica is not
// eligible). A continuation whose id the front never saw (it restarted,
// or the id was forgotten) is routed by its key.
//
// Bounds: a ResponseIDs remembers the MaxResponseIDs most recent ids
// (first in, first out): 12.1 MiB at the bound, 194 bytes an id of vLLM's
// shape (EXA_MEASURE=1 go test -run TestResponseIDsMemory -v
// ./internal/front).

// MaxResponseIDs is how many response ids a ResponseIDs remembers.
const MaxResponseIDs = 1 << 16

// MaxResponseHead is how many leading bytes of an answer a ResponseHead
// reads for its response id; an id past them is not learned.
const MaxResponseHead = 4 << 10

// responseOwner is the replica that produced a response.
type responseOwner struct{ model, replica string }

// ResponseIDs remembers the replica of each recent response id, at most
// MaxResponseIDs of them. Safe for concurrent use; the zero value is
// empty. A front keeps one.
type ResponseIDs struct {
	mu   sync.Mutex
	m    map[string]responseOwner
	ring []string // ids in the order learned; next is overwritten first
	next int
}

// Add remembers that replica of model produced response id.
func (r *ResponseIDs) Add(id, model, replica string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.m == nil {
		r.m = make(map[string]responseOwner)
		r.ring = make([]string, 0, 1024)
	}
	if _, ok := r.m[id]; ok {
		return
	}
	if len(r.ring) < MaxResponseIDs {
		r.ring = append(r.ring, id)
	} else {
		delete(r.m, r.ring[r.next])
		r.ring[r.next] = id
		r.next = (r.next + 1) % MaxResponseIDs
	}
	r.m[id] = responseOwner{model, replica}
}

// Owner returns the replica of model that produced response id, if known.
func (r *ResponseIDs) Owner(id, model string) (string, bool) {
	r.mu.Lock()
	defer r.mu.Unlock()
	o, ok := r.m[id]
	if !ok || o.model != model {
		return "", false
	}
	return o.replica, true
}

// ResponseID returns the id of the response whose answer begins with
// head: the first string member "id" whose value starts with "resp",
// within a JSON answer or an event stream; "" if head has none yet. An id
// longer than 256 bytes or holding an escape is not taken.
func ResponseID(head []byte) string {
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

// ResponseHead reads the head of one Responses API answer, chunk by
// chunk, for its id (ResponseID), up to MaxResponseHead bytes. The zero
// value is ready; Reset readies it for another answer, keeping its
// buffer. Not safe for concurrent use.
type ResponseHead struct {
	buf []byte // the head read so far, when the first chunk held no id
}

// Feed reads the answer's next chunk and returns its response id once
// the head holds one, with done true; done is true with an empty id when
// MaxResponseHead bytes held none. Feed is not to be called again once
// done. A head whose first chunk holds the id is read without copying.
func (h *ResponseHead) Feed(chunk []byte) (id string, done bool) {
	if len(h.buf) == 0 {
		c := chunk[:min(len(chunk), MaxResponseHead)]
		if id := ResponseID(c); id != "" {
			return id, true
		}
		if len(c) == MaxResponseHead {
			return "", true
		}
		h.buf = append(h.buf, c...)
		return "", false
	}
	h.buf = append(h.buf, chunk[:min(len(chunk), MaxResponseHead-len(h.buf))]...)
	if id := ResponseID(h.buf); id != "" {
		return id, true
	}
	return "", len(h.buf) >= MaxResponseHead
}

// Reset readies h for another answer.
func (h *ResponseHead) Reset() { h.buf = h.buf[:0] }
