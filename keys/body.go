package keys

import "unsafe"

// Header names a front reads to build a request's key, beside its body.
const (
	// HeaderSessionID names the conversation a request belongs to. It
	// takes precedence over the body's "user" field.
	HeaderSessionID = "X-Session-ID"
	// HeaderRAGContext names the retrieved context (a document set, a
	// corpus version, a hash of the retrieved passages) that the prompt
	// embeds, so that requests over the same context share a prefix.
	HeaderRAGContext = "X-RAG-Context"
)

// AppendKey appends the prefix key of r to dst, in h's blocks: its system
// (and developer) messages in order, then its tool definitions (Tools, in
// the system segment: most chat templates render them beside the system
// prompt, before the conversation), then its chat template arguments
// (ChatTemplateKwargs, in the system segment too: a template may read them
// anywhere, from its system header on, so the conversation after them is
// not shared across different ones), then the session (the
// HeaderSessionID value session, else the body's "user"), then the RAG
// context (the HeaderRAGContext value rag), then the rest of the
// conversation (or the completions prompt) in order, each part a segment
// in its role (Segment). With one system message and no conversation the
// key is PrefixKey's, and every chat turn extends the key of the turn
// before. A request with none of these (an empty prompt) gets a one-block
// key naming the model, so that it can still be routed. Both fronts key
// requests with it. It does not allocate when dst has room (and, for a
// request without text, its model name is shorter than 256 bytes).
func (r *Request) AppendKey(h *Hasher, dst Key, session, rag string) Key {
	start := len(dst)
	for i := range r.Messages {
		if m := &r.Messages[i]; isSystemRole(m.Role) {
			dst = h.AppendSegment(dst, SegmentSystem, m.Text)
		}
	}
	dst = h.AppendSegment(dst, SegmentSystem, r.Tools)
	dst = h.AppendSegment(dst, SegmentSystem, r.ChatTemplateKwargs)
	if session == "" {
		session = r.User
	}
	dst = h.AppendSegment(dst, SegmentSession, session)
	dst = h.AppendSegment(dst, SegmentRAG, rag)
	for i := range r.Messages {
		m := &r.Messages[i]
		if isSystemRole(m.Role) {
			continue
		}
		dst = h.AppendSegment(dst, roleSegment(m.Role), m.Text)
	}
	dst = h.AppendSegment(dst, SegmentPrompt, r.Prompt)
	if len(dst) == start {
		// The leading NUL keeps it apart from any ordinary message text.
		// The text is put together on the stack: a concatenation would
		// allocate for a model name past 31 bytes.
		var buf [256]byte
		if len(r.Model) >= len(buf) {
			return h.AppendSegment(dst, SegmentOther, "\x00"+r.Model)
		}
		b := append(append(buf[:0], 0), r.Model...)
		dst = h.AppendSegment(dst, SegmentOther, unsafe.String(&b[0], len(b)))
	}
	return dst
}

// isSystemRole reports whether a message role carries instructions that
// open the prompt: "system" or OpenAI's newer "developer".
func isSystemRole(role string) bool { return role == "system" || role == "developer" }

// roleSegment is the segment of a conversation message's role.
func roleSegment(role string) Segment {
	switch role {
	case "user":
		return SegmentUser
	case "assistant":
		return SegmentAssistant
	case "tool", "function":
		return SegmentTool
	}
	return SegmentOther
}
