package httpgw

import (
	"net/http"

	"github.com/examlops/gateway"
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

// Segment tags, one per kind of segment, so that the same text in two
// roles hashes differently (see gateway.Hasher.AppendSegment).
const (
	tagSystem    uint64 = 0x6777_0001_7379_7374 // "sys"
	tagSession   uint64 = 0x6777_0002_7365_7373 // "sess"
	tagRAG       uint64 = 0x6777_0003_7261_6700 // "rag"
	tagUser      uint64 = 0x6777_0004_7573_6572 // "user"
	tagAssistant uint64 = 0x6777_0005_6173_7374 // "asst"
	tagTool      uint64 = 0x6777_0006_746f_6f6c // "tool"
	tagOther     uint64 = 0x6777_0007_6f74_6872 // other roles
	tagPrompt    uint64 = 0x6777_0008_7072_6d74 // completions prompt
	tagModel     uint64 = 0x6777_0009_6d6f_646c // fallback for an empty prompt
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
// the conversation (or the completions prompt) in order. Each part is its
// own segment with its own tag. A request with none of these (an empty
// prompt) gets a one-block key naming the model, so that it can still be
// routed.
func appendKey(h *gateway.Hasher, dst gateway.Key, req *inferenceRequest, hdr http.Header) gateway.Key {
	start := len(dst)
	for i := range req.Messages {
		if m := &req.Messages[i]; isSystemRole(m.Role) {
			dst = h.AppendSegment(dst, tagSystem, m.Text)
		}
	}
	dst = h.AppendSegment(dst, tagSession, session(req, hdr))
	dst = h.AppendSegment(dst, tagRAG, hdr.Get(HeaderRAGContext))
	for i := range req.Messages {
		m := &req.Messages[i]
		if isSystemRole(m.Role) {
			continue
		}
		dst = h.AppendSegment(dst, roleTag(m.Role), m.Text)
	}
	dst = h.AppendSegment(dst, tagPrompt, req.Prompt)
	if len(dst) == start {
		dst = h.AppendSegment(dst, tagModel, "\x00"+req.Model)
	}
	return dst
}

// isSystemRole reports whether a message role carries instructions that
// open the prompt: "system" or OpenAI's newer "developer".
func isSystemRole(role string) bool { return role == "system" || role == "developer" }

func roleTag(role string) uint64 {
	switch role {
	case "user":
		return tagUser
	case "assistant":
		return tagAssistant
	case "tool", "function":
		return tagTool
	}
	return tagOther
}
