package httpgw

import (
	"net/http"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/keys"
)

// Header names the gateway reads to build a request's prefix key.
const (
	// HeaderSessionID names the conversation a request belongs to. It
	// takes precedence over the body's "user" field.
	HeaderSessionID = "X-Session-ID"
	// HeaderRAGContext names the retrieved context (a document set, a
	// corpus version, a hash of the retrieved passages) that the prompt
	// embeds, so that requests over the same context share a prefix.
	HeaderRAGContext = "X-RAG-Context"
)

// session returns the request's session id: the X-Session-ID header, else
// the body's "user" field.
func session(req *inferenceRequest, h http.Header) string {
	if s := h.Get(HeaderSessionID); s != "" {
		return s
	}
	return req.User
}

// appendKey appends the prefix key of req to dst: system messages in
// order, then the session, then the RAG context header, then the rest of
// the conversation (or the completions prompt) in order, each part a
// segment in its role (keys.Segment), so that with one system message
// and no conversation the key is keys.PrefixKey's. A request with none
// of these (an empty prompt) gets a one-block key naming the model, so
// that it can still be routed.
func appendKey(h *keys.Hasher, dst gateway.Key, req *inferenceRequest, hdr http.Header) gateway.Key {
	start := len(dst)
	for i := range req.Messages {
		if m := &req.Messages[i]; isSystemRole(m.Role) {
			dst = h.AppendSegment(dst, keys.SegmentSystem, m.Text)
		}
	}
	dst = h.AppendSegment(dst, keys.SegmentSession, session(req, hdr))
	dst = h.AppendSegment(dst, keys.SegmentRAG, hdr.Get(HeaderRAGContext))
	for i := range req.Messages {
		m := &req.Messages[i]
		if isSystemRole(m.Role) {
			continue
		}
		dst = h.AppendSegment(dst, roleSegment(m.Role), m.Text)
	}
	dst = h.AppendSegment(dst, keys.SegmentPrompt, req.Prompt)
	if len(dst) == start {
		// The leading NUL keeps it apart from any ordinary message text.
		dst = h.AppendSegment(dst, keys.SegmentOther, "\x00"+req.Model)
	}
	return dst
}

// isSystemRole reports whether a message role carries instructions that
// open the prompt: "system" or OpenAI's newer "developer".
func isSystemRole(role string) bool { return role == "system" || role == "developer" }

// roleSegment is the segment of a conversation message's role.
func roleSegment(role string) keys.Segment {
	switch role {
	case "user":
		return keys.SegmentUser
	case "assistant":
		return keys.SegmentAssistant
	case "tool", "function":
		return keys.SegmentTool
	}
	return keys.SegmentOther
}
