package front

import "bytes"

// This file counts the output tokens of an engine's answer as a front
// relays it, for gateway.DoneInfo.OutputTokens (from which the library
// learns each replica's time per output token).
//
// The count is the answer's usage when it carries one: the last
// "completion_tokens" (chat and completions) or "output_tokens" (the
// Responses API) member anywhere in it, as vLLM and SGLang put in a
// whole answer, in a stream's last chunk when the request asked for
// stream_options.include_usage (the HTTP gateway asks for it when it
// streams a non-streamed request from the engine), and in every chunk
// with continuous usage stats (the last is the total). A stream without
// usage is counted by its chunks: each member "content", "text",
// "reasoning_content", "reasoning" or "delta" whose value is a non-empty
// string, and each "tool_calls" array, counts one token: an engine
// sending one token per chunk (vLLM's default) is counted exactly, one
// batching several (stream_interval, speculative decoding) short. A whole
// answer without usage counts 0 (unknown).
//
// The meter matches member names on the raw bytes: in valid JSON a quote
// inside a string is escaped (preceded by a backslash), and a quote that
// ends a string is followed by no letter, so a name matched at a quote
// not preceded by a backslash is a member name, never text of the
// answer. It holds a fixed window (meterWindow bytes) and
// allocates nothing; malformed bytes only make it count less.

const (
	// meterWindow is the meter's buffer; meterLook the most bytes a match
	// reads past its opening quote (the longest name, its colon, up to
	// meterSpaces spaces and a 7-digit count).
	meterWindow = 512
	meterLook   = 64
	meterSpaces = 8
	// meterMaxCount bounds a usage count read: more digits are not a
	// count (and would overflow).
	meterMaxCount = 1 << 30
)

// Meter counts the output tokens of one answer (see above). The zero
// value meters a whole (non-SSE) answer; Reset prepares it for another.
// Not safe for concurrent use.
type Meter struct {
	win  [meterWindow]byte
	n    int  // bytes in win
	prev byte // the byte before win[0]

	sse      bool
	usage    int // the last usage count, valid when hasUsage
	hasUsage bool
	chunks   int
}

// Reset empties m for an answer, sse true for an event stream.
func (m *Meter) Reset(sse bool) {
	m.n, m.prev, m.sse, m.usage, m.hasUsage, m.chunks = 0, 0, sse, 0, false, 0
}

// Feed reads the next bytes of the answer.
func (m *Meter) Feed(b []byte) {
	for len(b) > 0 {
		k := copy(m.win[m.n:], b)
		m.n += k
		b = b[k:]
		if m.n == len(m.win) {
			m.scan(m.n - meterLook)
		}
	}
}

// Tokens returns the answer's output tokens once it has ended: its
// usage's count (fromUsage true) when it carried one, else for a stream
// its chunks with content, else 0 (unknown).
func (m *Meter) Tokens() (n int, fromUsage bool) {
	m.scan(m.n)
	switch {
	case m.hasUsage:
		return m.usage, true
	case m.sse:
		return m.chunks, false
	}
	return 0, false
}

// scan matches the names starting before end in the window, then keeps
// its bytes from end on for the next.
func (m *Meter) scan(end int) {
	w := m.win[:m.n]
	for i := 0; i < end; {
		j := bytes.IndexByte(w[i:end], '"')
		if j < 0 {
			break
		}
		i += j
		before := m.prev
		if i > 0 {
			before = w[i-1]
		}
		if before != '\\' {
			m.match(w[i:min(i+meterLook, len(w))])
		}
		i++
	}
	if end > 0 {
		m.prev = w[end-1]
		m.n = copy(m.win[:], w[end:])
	}
}

// The member names the meter matches, with their closing quote.
const (
	meterCompletionTokens = `"completion_tokens"`
	meterOutputTokens     = `"output_tokens"`
	meterToolCalls        = `"tool_calls"`
)

// match reads a member name at the start of b (an unescaped quote) and
// what follows its colon. It dispatches on the name's first letter: most
// quotes start other names or values.
func (m *Meter) match(b []byte) {
	if len(b) < 2 {
		return
	}
	var chunk []string
	switch b[1] {
	case 'c':
		if v, ok := value(b, meterCompletionTokens); ok {
			m.countUsage(v)
			return
		}
		chunk = []string{`"content"`}
	case 'o':
		if v, ok := value(b, meterOutputTokens); ok {
			m.countUsage(v)
		}
		return
	case 't':
		if !m.sse {
			return
		}
		if v, ok := value(b, meterToolCalls); ok {
			if len(v) > 0 && v[0] == '[' {
				m.chunks++
			}
			return
		}
		chunk = []string{`"text"`}
	case 'r':
		chunk = []string{`"reasoning_content"`, `"reasoning"`}
	case 'd':
		chunk = []string{`"delta"`}
	default:
		return
	}
	if !m.sse {
		return
	}
	for _, name := range chunk {
		if v, ok := value(b, name); ok {
			if len(v) >= 2 && v[0] == '"' && v[1] != '"' {
				m.chunks++
			}
			return
		}
	}
}

// countUsage reads a usage count.
func (m *Meter) countUsage(v []byte) {
	if n, ok := count(v); ok {
		m.usage, m.hasUsage = n, true
	}
}

// value returns what follows name's colon in b (spaces skipped), if b
// starts with name and a colon.
func value(b []byte, name string) ([]byte, bool) {
	if len(b) <= len(name) || string(b[:len(name)]) != name {
		return nil, false
	}
	b = skipSpaces(b[len(name):])
	if len(b) == 0 || b[0] != ':' {
		return nil, false
	}
	return skipSpaces(b[1:]), true
}

func skipSpaces(b []byte) []byte {
	for i := 0; i < meterSpaces && len(b) > 0; i++ {
		switch b[0] {
		case ' ', '\t', '\r', '\n':
			b = b[1:]
		default:
			return b
		}
	}
	return b
}

// count reads the non-negative integer at the start of b, ended by a
// byte that is not a digit (a count cut by the window's end is not read).
func count(b []byte) (int, bool) {
	n, i := 0, 0
	for ; i < len(b) && b[i] >= '0' && b[i] <= '9'; i++ {
		n = n*10 + int(b[i]-'0')
		if n > meterMaxCount {
			return 0, false
		}
	}
	if i == 0 || i == len(b) {
		return 0, false
	}
	return n, true
}
