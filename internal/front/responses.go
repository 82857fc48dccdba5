package front

import "bytes"

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
// The table of learned ids (ResponseIDs, responseids.go) is bounded, and
// no client can take its share of it from another.

// MaxResponseHead is how many leading bytes of an answer a ResponseHead
// reads for its response id; an id past them is not learned.
const MaxResponseHead = 4 << 10

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
