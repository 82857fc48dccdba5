package sseagg

import (
	"bytes"
	"errors"
	"fmt"
	"strconv"
	"unsafe"

	"github.com/examlops/gateway/internal/jsonscan"
)

// This file assembles a non-streamed answer from an engine's stream.
//
// A non-streamed answer's first byte is its completion, so a gateway that
// relays it learns the request's first token (gateway.Decision.FirstToken,
// which releases its pending prefill) only when the whole answer is
// generated. As Dynamo's frontend does, the gateway instead asks the engine
// to stream every chat and completions request whose client did not
// (upstream.go) and gives the client the non-streamed JSON answer it asked
// for, assembled here from the stream's chunks:
//
//   - top level: every member the chunks carry (id, object, created, model,
//     system_fingerprint, usage, ...), in the order first seen, each with its
//     last non-null value; "object" "chat.completion.chunk" becomes
//     "chat.completion" ("text_completion" stays);
//   - choices, by "index", ascending: for chat a "message" merged from the
//     deltas (role, default "assistant"; content, reasoning_content,
//     reasoning and refusal concatenated; tool_calls merged by index: id
//     and type last non-empty, function name and arguments concatenated;
//     any other delta member last non-null), for completions "text"
//     concatenated; "logprobs" with every array member concatenated
//     (content for chat; tokens, token_logprobs, top_logprobs, text_offset
//     for completions); "token_ids" concatenated; finish_reason and any
//     other member last non-null.
//
// The chunks' strings are joined as written (escaped JSON), never decoded
// and encoded again, so the answer holds the engine's own text.

// Member names the Aggregator treats specially.
const (
	aggChoices      = "choices"
	aggIndex        = "index"
	aggDelta        = "delta"
	aggLogprobs     = "logprobs"
	aggToolCalls    = "tool_calls"
	aggFinishReason = "finish_reason"
	aggObject       = "object"
	aggError        = "error"
)

// maxAggChoices bounds the choices of one answer (a request's "n"); an
// index outside [0, maxAggChoices) is an error.
const maxAggChoices = 1 << 12

// maxAggMembers bounds the distinct members of one object the Aggregator
// merges member by member (the top level, a choice, a chat delta, a
// logprobs object), so that their weight stays small (past indexAfter a
// member is found through a map); an engine's have a dozen or so.
const maxAggMembers = 1 << 8

// ErrAggregate marks a stream the gateway could not assemble into an
// answer; the client gets a 502.
var ErrAggregate = errors.New("the engine's stream cannot be assembled into an answer")

// ErrStreamEvent marks an error event in the engine's stream.
var ErrStreamEvent = errors.New("the engine's stream carried an error event")

// How a member's values combine.
const (
	kindNone   = iota // no non-null value yet
	kindRaw           // last non-null value, as written
	kindString        // strings joined: raw holds the escaped interior
	kindArray         // arrays joined: raw holds the elements, comma separated
)

// aggMember is one member of an assembled object. A joined value
// (kindString, kindArray) longer than blockSize is held in blocks: full
// ones, then raw; any other in raw alone.
type aggMember struct {
	name string
	kind int
	full [][]byte
	raw  []byte
}

// blockSize is the size of a joined value's blocks: a long answer grows
// by new blocks rather than by copying its content into ever larger
// buffers (which would leave the collector about four times the content
// in garbage), and the answer refers to them rather than copying them.
const blockSize = 64 << 10

// len returns the length of the member's value.
func (m *aggMember) len() int {
	n := len(m.raw)
	for _, b := range m.full {
		n += len(b)
	}
	return n
}

// join appends b to the member's joined value, in blocks.
func (g *Aggregator) join(m *aggMember, b []byte) {
	for len(b) > 0 {
		if len(m.raw) == blockSize {
			m.full = append(m.full, m.raw)
			m.raw = nil
		}
		n := min(len(b), blockSize-len(m.raw))
		if len(m.raw)+n > cap(m.raw) {
			nb := make([]byte, len(m.raw), min(max(2*cap(m.raw), len(m.raw)+n), blockSize))
			copy(nb, m.raw)
			g.held += cap(nb) - cap(m.raw)
			m.raw = nb
		}
		m.raw = append(m.raw, b[:n]...)
		b = b[n:]
	}
}

// aggMembers is the members of an object, in the order first seen.
type aggMembers struct {
	ms []aggMember
	// pos finds a member by name, once there are more than indexAfter.
	pos map[string]int
}

// indexAfter is how many members of an object, choices, or tool calls of
// a choice are found by a scan; past it they are found through a map, so
// that a stream naming one among hundreds or thousands (a hostile
// engine's) again and again does not scan them all each time: 2.5 to 7
// MB/s of such a stream before, against 100-350 MB/s for an engine's
// usual one (BenchmarkAggregateLookups, BenchmarkAggregate).
const indexAfter = 8

// mapWeight is what Held counts for an entry of such a map.
const mapWeight = 48

// indexed records item n-1 of n, just appended with key k, in *pos,
// building *pos from all n (whose keys key gives) once n passes
// indexAfter.
func indexed[K comparable](g *Aggregator, pos *map[K]int, n int, k K, key func(int) K) {
	if n <= indexAfter {
		return
	}
	if *pos == nil {
		*pos = make(map[K]int, n)
		for i := range n - 1 {
			(*pos)[key(i)] = i
		}
		g.held += (n - 1) * mapWeight
	}
	(*pos)[k] = n - 1
	g.held += mapWeight
}

// aggTool is one tool call of a chat choice.
type aggTool struct {
	index             int
	id, typ           aggMember
	fnName, arguments aggMember
}

// aggChoice is one choice of the answer.
type aggChoice struct {
	index int
	// msg holds the chat delta's members (text, for completions, is in
	// other), tools its tool calls.
	msg   aggMembers
	tools []aggTool
	// toolPos finds a tool call by index, once there are more than
	// indexAfter.
	toolPos map[int]int
	// lp is the logprobs: when lpObj, an object whose members are in
	// lpMembers, else lpRaw (null when kindNone).
	lpObj     bool
	lpMembers aggMembers
	lpRaw     aggMember
	// other holds every other member of the choice (finish_reason, text...).
	other aggMembers
}

// Aggregator assembles an answer from an engine's SSE stream (feed, then
// answer). lineLimit bounds one SSE line, limit the bytes held in all. The
// zero value is not usable: see newAggregator. Not safe for concurrent use.
type Aggregator struct {
	chat             bool
	limit, lineLimit int
	size             int // bytes held, against limit
	// held is the memory the aggregator holds: its buffers' capacities
	// (which append grows past their lengths) and the members' and
	// choices' own weights; see Held.
	held int

	line    []byte // a partial line, across feeds
	cr      bool   // the last line ended with a CR (an LF next is its end too)
	started bool   // a line was read (a BOM is ignored before the first only)
	data    []byte // the current event's data
	hasData bool

	// chunks counts the completion chunks read; done is set at [DONE].
	chunks int
	done   bool

	top     aggMembers
	choices []aggChoice
	// choicePos finds a choice by index, once there are more than
	// indexAfter.
	choicePos map[int]int
	r         jsonscan.Reader
}

// New returns an Aggregator for a chat (or else completions)
// answer, holding at most limit bytes, with SSE lines of at most
// lineLimit bytes.
func New(chat bool, limit, lineLimit int) *Aggregator {
	return &Aggregator{chat: chat, limit: limit, lineLimit: lineLimit}
}

// LimitFactor times a front's request-body bound bounds one answer it
// assembles (ForBodies); one SSE line is bounded by the body bound.
const LimitFactor = 4

// ForBodies returns the Aggregator of a front whose request bodies are
// bounded by maxBody bytes: holding at most LimitFactor times maxBody
// (32 MiB at the fronts' default 8 MiB), with SSE lines of at most
// maxBody, each capped at 1 TiB.
func ForBodies(chat bool, maxBody int64) *Aggregator {
	// Capped before it is multiplied, so that a huge maxBody cannot wrap.
	return New(chat, int(min(maxBody, 1<<40/LimitFactor)*LimitFactor), int(min(maxBody, 1<<40)))
}

// Step is the step in which a front reserves memory for an answer being
// assembled (Held), the first before the request is sent.
const Step = 16 << 10

// Charge is how many times the memory an Aggregator holds (Held) a
// front reserves for it: the collector's headroom at GOGC=100, and the
// copies of the answer sent on while it is still held. Measured through
// the picker with charge 1: 60 answers of 8 MiB against a 256 MiB budget
// peaked at 433-473 MB of RSS, 98 MB of it gRPC's encoded copies
// (exa TestPickerRSSAssembled).
const Charge = 2

// RoundStep returns n rounded up to a multiple of Step.
func RoundStep(n int64) int64 { return (n + Step - 1) / Step * Step }

// Chunks returns how many completion chunks Feed has read so far: the
// first one is the answer's first token.
func (g *Aggregator) Chunks() int { return g.chunks }

// Held returns the bytes of memory the Aggregator holds: the capacity of
// its buffers (the answer's pieces, the partial SSE line and event) and
// the weight of its members and choices. It only grows; Parts adds
// nothing to it (the answer's long values are not copied).
func (g *Aggregator) Held() int { return g.held }

// appendTracked appends b to *dst, counting a change of capacity in held.
func (g *Aggregator) appendTracked(dst *[]byte, b ...byte) {
	c := cap(*dst)
	*dst = append(*dst, b...)
	g.held += cap(*dst) - c
}

// appendHeld appends v to *s, counting a change of the slice's capacity
// in g.held: the weight of the members, choices and tool calls, which
// outweighs their bytes in an answer of many small pieces.
func appendHeld[T any](g *Aggregator, s *[]T, v T) {
	c := cap(*s)
	*s = append(*s, v)
	g.held += (cap(*s) - c) * int(unsafe.Sizeof(v))
}

// Feed reads the next bytes of the stream. An error (a malformed or
// oversized chunk, an error event) ends the aggregation.
func (g *Aggregator) Feed(b []byte) error {
	for len(b) > 0 {
		if g.cr {
			// The last line ended with a CR: an LF right after it (here,
			// at the start of the next read) ends the same line.
			g.cr = false
			if b[0] == '\n' {
				b = b[1:]
				continue
			}
		}
		// A line ends at CRLF, LF or a lone CR. The LF is looked for
		// first (one fast scan), then a CR before it.
		i, next := bytes.IndexByte(b, '\n'), 0
		seg := b
		if i >= 0 {
			seg = b[:i]
		}
		switch j := bytes.IndexByte(seg, '\r'); {
		case j >= 0 && j == i-1:
			i, next = j, i+1 // CRLF
		case j >= 0:
			i, next = j, j+1 // a lone CR, or one last in b (an LF may follow)
			g.cr = true
		case i >= 0:
			next = i + 1
		default:
			if len(g.line)+len(b) > g.lineLimit {
				return fmt.Errorf("%w: an SSE line exceeds %d bytes", ErrAggregate, g.lineLimit)
			}
			g.appendTracked(&g.line, b...)
			return nil
		}
		line := b[:i]
		if len(g.line) > 0 {
			if len(g.line)+i > g.lineLimit {
				return fmt.Errorf("%w: an SSE line exceeds %d bytes", ErrAggregate, g.lineLimit)
			}
			g.appendTracked(&g.line, line...)
			line = g.line
		} else if i > g.lineLimit {
			return fmt.Errorf("%w: an SSE line exceeds %d bytes", ErrAggregate, g.lineLimit)
		}
		b = b[next:]
		err := g.onLine(line)
		g.line = g.line[:0]
		if err != nil {
			return err
		}
	}
	return nil
}

// onLine reads one SSE line (the WHATWG event-stream rules: lines ended
// by CRLF, LF or CR (Feed), data lines joined by newlines, an empty line
// ends the event, comments and other fields ignored, as is a byte order
// mark at the stream's start).
func (g *Aggregator) onLine(line []byte) error {
	if !g.started {
		g.started = true
		line = bytes.TrimPrefix(line, []byte("\ufeff"))
	}
	if len(line) == 0 {
		if !g.hasData {
			return nil
		}
		g.hasData = false
		return g.event(g.data)
	}
	field, value := line, []byte(nil)
	if i := bytes.IndexByte(line, ':'); i >= 0 {
		field, value = line[:i], line[i+1:]
		value = bytes.TrimPrefix(value, []byte(" "))
	}
	if string(field) != "data" {
		return nil // a comment (":..."), event, id or retry line
	}
	if !g.hasData {
		g.data = g.data[:0]
	} else {
		g.appendTracked(&g.data, '\n')
	}
	if len(g.data)+len(value) > g.lineLimit {
		return fmt.Errorf("%w: an SSE event exceeds %d bytes", ErrAggregate, g.lineLimit)
	}
	g.appendTracked(&g.data, value...)
	g.hasData = true
	return nil
}

// event reads one event's data: [DONE], or a JSON chunk.
func (g *Aggregator) event(data []byte) error {
	if g.done {
		return nil // nothing counts after [DONE]
	}
	if string(bytes.TrimSpace(data)) == "[DONE]" {
		g.done = true
		return nil
	}
	if err := g.chunk(data); err != nil {
		return err
	}
	g.chunks++
	return nil
}

// grow counts n more bytes held (n may be negative).
func (g *Aggregator) grow(n int) error {
	g.size += n
	if g.size > g.limit {
		return fmt.Errorf("%w: the answer exceeds %d bytes", ErrAggregate, g.limit)
	}
	return nil
}

// find returns the member named name of o, adding it if absent (and
// counting its weight: the next merge checks the limit); an error past
// maxAggMembers.
func (g *Aggregator) find(o *aggMembers, name []byte) (*aggMember, error) {
	if o.pos != nil {
		if i, ok := o.pos[string(name)]; ok {
			return &o.ms[i], nil
		}
	} else if m := lookup(o.ms, string(name)); m != nil {
		return m, nil
	}
	if len(o.ms) >= maxAggMembers {
		return nil, fmt.Errorf("%w: an object has more than %d members", ErrAggregate, maxAggMembers)
	}
	g.size += len(name) + 48
	g.held += len(name)
	appendHeld(g, &o.ms, aggMember{name: string(name)})
	n := len(o.ms)
	indexed(g, &o.pos, n, o.ms[n-1].name, func(i int) string { return o.ms[i].name })
	return &o.ms[n-1], nil
}

// mergeInto merges the next value of b into the member named name of o
// (find, then merge).
func (g *Aggregator) mergeInto(o *aggMembers, name, b []byte, join int) error {
	m, err := g.find(o, name)
	if err != nil {
		return err
	}
	return g.merge(m, b, join)
}

// lookup returns the member named name of ms, nil if absent.
func lookup(ms []aggMember, name string) *aggMember {
	for i := range ms {
		if ms[i].name == name {
			return &ms[i]
		}
	}
	return nil
}

// none is a member without a value (rendered null).
var none aggMember

// merge reads the next value of b into m: kind kindString joins strings,
// kindArray joins arrays, kindRaw keeps the last one. A null changes
// nothing; a value of another type than the join expects replaces the
// member's value (last wins).
func (g *Aggregator) merge(m *aggMember, b []byte, join int) error {
	r := &g.r
	c := r.Peek()
	start := r.Offset()
	if err := r.Skip(); err != nil {
		return err
	}
	raw := b[start:r.Offset()]
	if c == 'n' {
		return g.grow(0)
	}
	old := m.len()
	switch {
	case join == kindString && c == '"' && m.kind != kindRaw:
		m.kind = kindString
		g.join(m, raw[1:len(raw)-1])
	case join == kindArray && c == '[' && m.kind != kindRaw:
		m.kind = kindArray
		if in := bytes.TrimSpace(raw[1 : len(raw)-1]); len(in) > 0 {
			if old > 0 {
				g.join(m, []byte{','})
			}
			g.join(m, in)
		}
	default:
		m.kind = kindRaw
		m.full = nil
		m.raw = m.raw[:0]
		g.appendTracked(&m.raw, raw...)
	}
	return g.grow(m.len() - old)
}

// chunk reads one JSON chunk of the stream.
func (g *Aggregator) chunk(b []byte) error {
	r := &g.r
	r.Reset(b)
	if r.Peek() != '{' {
		return fmt.Errorf("%w: a chunk is not a JSON object", ErrAggregate)
	}
	var evErr error
	err := r.ObjectBytes(func(name []byte) error {
		switch string(name) {
		case aggChoices:
			if r.Null() {
				return nil
			}
			m, err := g.find(&g.top, []byte(aggChoices))
			if err != nil {
				return err
			}
			m.kind = kindRaw // placed where first seen
			pos := 0
			return r.Array(func() error {
				defer func() { pos++ }()
				return g.choice(b, pos)
			})
		case aggError:
			r.Peek()
			start := r.Offset()
			if err := r.Skip(); err != nil {
				return err
			}
			evErr = fmt.Errorf("%w: %s", ErrStreamEvent, clip(b[start:r.Offset()], 1024))
			return nil
		}
		return g.mergeInto(&g.top, name, b, kindRaw)
	})
	if err == nil && !r.End() {
		err = r.Errorf("data after the chunk")
	}
	switch {
	case evErr != nil:
		return evErr
	case errors.Is(err, ErrAggregate):
		return err
	case err != nil:
		return fmt.Errorf("%w: a chunk: %w", ErrAggregate, err)
	}
	return nil
}

// clip returns b, cut to at most n bytes, as a string.
func clip(b []byte, n int) string {
	if len(b) > n {
		return string(b[:n]) + "..."
	}
	return string(b)
}

// uint reads a non-negative integer below maxAggChoices.
func (g *Aggregator) uint(b []byte, what string) (int, error) {
	r := &g.r
	r.Peek() // the value starts after any white space
	start := r.Offset()
	if err := r.Skip(); err != nil {
		return 0, err
	}
	v := 0
	for _, c := range b[start:r.Offset()] {
		if c < '0' || c > '9' || v >= maxAggChoices {
			return 0, fmt.Errorf("%w: %s %s is not an integer in [0, %d)", ErrAggregate, what, clip(b[start:r.Offset()], 32), maxAggChoices)
		}
		v = v*10 + int(c-'0')
	}
	if v >= maxAggChoices || start == r.Offset() {
		return 0, fmt.Errorf("%w: %s %s is not an integer in [0, %d)", ErrAggregate, what, clip(b[start:r.Offset()], 32), maxAggChoices)
	}
	return v, nil
}

// choice reads one element of a chunk's choices (pos is its place in the
// array, its index when it gives none).
func (g *Aggregator) choice(b []byte, pos int) error {
	r := &g.r
	// The index may come after the members it qualifies: read it first.
	save := *r
	idx := pos
	if pos >= maxAggChoices {
		return fmt.Errorf("%w: more than %d choices", ErrAggregate, maxAggChoices)
	}
	if r.Peek() != '{' {
		return fmt.Errorf("%w: a choice is not an object", ErrAggregate)
	}
	err := r.ObjectBytes(func(name []byte) error {
		if string(name) != aggIndex {
			return r.Skip()
		}
		var err error
		idx, err = g.uint(b, "choices[].index")
		return err
	})
	if err != nil {
		return err
	}
	end := *r
	*r = save
	ch := g.choiceAt(idx)
	if err := g.grow(0); err != nil {
		return err
	}
	err = r.ObjectBytes(func(name []byte) error {
		switch {
		case string(name) == aggIndex:
			return r.Skip()
		case string(name) == aggDelta && g.chat:
			if r.Null() {
				return nil
			}
			return r.ObjectBytes(func(name []byte) error { return g.delta(ch, name, b) })
		case string(name) == aggLogprobs:
			return g.logprobs(ch, b)
		case string(name) == "text" && !g.chat:
			return g.mergeInto(&ch.other, name, b, kindString)
		case string(name) == "token_ids":
			return g.mergeInto(&ch.other, name, b, kindArray)
		}
		return g.mergeInto(&ch.other, name, b, kindRaw)
	})
	if err != nil {
		return err
	}
	*r = end
	return nil
}

// choiceAt returns the choice of index idx, adding it if absent.
func (g *Aggregator) choiceAt(idx int) *aggChoice {
	if g.choicePos != nil {
		if i, ok := g.choicePos[idx]; ok {
			return &g.choices[i]
		}
	} else {
		for i := range g.choices {
			if g.choices[i].index == idx {
				return &g.choices[i]
			}
		}
	}
	g.size += 64 // a choice's own weight, so that many empty ones count
	appendHeld(g, &g.choices, aggChoice{index: idx})
	n := len(g.choices)
	indexed(g, &g.choicePos, n, idx, func(i int) int { return g.choices[i].index })
	return &g.choices[n-1]
}

// delta reads one member of a chat choice's delta.
func (g *Aggregator) delta(ch *aggChoice, name []byte, b []byte) error {
	r := &g.r
	switch string(name) {
	case "content", "reasoning_content", "reasoning", "refusal":
		return g.mergeInto(&ch.msg, name, b, kindString)
	case aggToolCalls:
		if r.Null() {
			return nil
		}
		pos := 0
		return r.Array(func() error {
			defer func() { pos++ }()
			return g.toolCall(ch, b, pos)
		})
	}
	return g.mergeInto(&ch.msg, name, b, kindRaw)
}

// toolCall reads one element of a delta's tool_calls (pos is its place in
// the array, its index when it gives none).
func (g *Aggregator) toolCall(ch *aggChoice, b []byte, pos int) error {
	r := &g.r
	if r.Peek() != '{' {
		return fmt.Errorf("%w: a tool call is not an object", ErrAggregate)
	}
	save := *r
	idx := pos
	err := r.ObjectBytes(func(name []byte) error {
		if string(name) != aggIndex {
			return r.Skip()
		}
		var err error
		idx, err = g.uint(b, "tool_calls[].index")
		return err
	})
	if err != nil {
		return err
	}
	end := *r
	*r = save
	var tc *aggTool
	if ch.toolPos != nil {
		if i, ok := ch.toolPos[idx]; ok {
			tc = &ch.tools[i]
		}
	} else {
		for i := range ch.tools {
			if ch.tools[i].index == idx {
				tc = &ch.tools[i]
				break
			}
		}
	}
	if tc == nil {
		if len(ch.tools) >= maxAggChoices {
			return fmt.Errorf("%w: more than %d tool calls", ErrAggregate, maxAggChoices)
		}
		g.size += 64
		appendHeld(g, &ch.tools, aggTool{index: idx})
		n := len(ch.tools)
		indexed(g, &ch.toolPos, n, idx, func(i int) int { return ch.tools[i].index })
		tc = &ch.tools[n-1]
	}
	err = r.ObjectBytes(func(name []byte) error {
		switch string(name) {
		case "id":
			return g.mergeNonEmpty(&tc.id, b)
		case "type":
			return g.mergeNonEmpty(&tc.typ, b)
		case "function":
			if r.Null() {
				return nil
			}
			return r.ObjectBytes(func(name []byte) error {
				switch string(name) {
				case "name":
					return g.merge(&tc.fnName, b, kindString)
				case "arguments":
					return g.merge(&tc.arguments, b, kindString)
				}
				return r.Skip()
			})
		}
		return r.Skip()
	})
	if err != nil {
		return err
	}
	*r = end
	return nil
}

// mergeNonEmpty is merge keeping the last value that is neither null nor
// the empty string.
func (g *Aggregator) mergeNonEmpty(m *aggMember, b []byte) error {
	g.r.Peek() // the value starts after any white space
	if bytes.HasPrefix(b[g.r.Offset():], []byte(`""`)) {
		return g.r.Skip()
	}
	return g.merge(m, b, kindRaw)
}

// logprobs reads a choice's logprobs: an object's array members join.
func (g *Aggregator) logprobs(ch *aggChoice, b []byte) error {
	r := &g.r
	switch {
	case r.Null():
		return nil
	case r.Peek() == '{' && (ch.lpObj || ch.lpRaw.kind == kindNone):
		ch.lpObj = true
		return r.ObjectBytes(func(name []byte) error { return g.mergeInto(&ch.lpMembers, name, b, kindArray) })
	}
	ch.lpObj = false
	ch.lpMembers = aggMembers{ms: ch.lpMembers.ms[:0]}
	return g.merge(&ch.lpRaw, b, kindRaw)
}

// Answer returns the assembled answer in one slice (Parts joined). It is
// an error if the stream did not end with [DONE] or carried no chunk.
func (g *Aggregator) Answer() ([]byte, error) {
	parts, n, err := g.Parts()
	if err != nil {
		return nil, err
	}
	out := make([]byte, 0, n)
	for _, p := range parts {
		out = append(out, p...)
	}
	return out, nil
}

// Parts returns the assembled answer as consecutive parts of n bytes in
// all: the long values of its members (content, text, arguments,
// logprobs...) are the Aggregator's own buffers, not copied, so that the
// answer costs no second copy of its content; the parts are valid as long
// as the Aggregator is and it is not fed again. It is an error if the
// stream did not end with [DONE] or carried no chunk.
func (g *Aggregator) Parts() (parts [][]byte, n int, err error) {
	if !g.done && len(g.line) > 0 && g.onLine(g.line) == nil {
		g.line = g.line[:0] // a last line without its newline
	}
	if !g.done && g.hasData && string(bytes.TrimSpace(g.data)) == "[DONE]" {
		g.done = true // a last event without its blank line
	}
	if !g.done {
		return nil, 0, fmt.Errorf("%w: the stream ended before its data: [DONE]", ErrAggregate)
	}
	if g.chunks == 0 {
		return nil, 0, fmt.Errorf("%w: the stream carried no chunk", ErrAggregate)
	}
	// Choices in index order (insertion sort: they are few, and mostly in order).
	cs := g.choices
	for i := 1; i < len(cs); i++ {
		for j := i; j > 0 && cs[j].index < cs[j-1].index; j-- {
			cs[j], cs[j-1] = cs[j-1], cs[j]
		}
	}
	g.choicePos = nil // the places moved; rebuilt if the choices grow again
	o := &output{cur: make([]byte, 0, 512)}
	o.byte('{')
	hasChoices := false
	for i := range g.top.ms {
		m := &g.top.ms[i]
		if i > 0 {
			o.byte(',')
		}
		o.name(m.name)
		switch {
		case m.name == aggChoices:
			hasChoices = true
			g.appendChoices(o)
		case m.name == aggObject && string(m.raw) == `"chat.completion.chunk"`:
			o.str(`"chat.completion"`)
		default:
			o.value(m)
		}
	}
	if !hasChoices {
		if len(g.top.ms) > 0 {
			o.byte(',')
		}
		o.name(aggChoices)
		g.appendChoices(o)
	}
	o.byte('}')
	o.cut()
	return o.parts, o.n, nil
}

// refMin is the length from which a value goes into the answer by
// reference rather than copied.
const refMin = 4 << 10

// output builds an answer as parts: short pieces copied into cur, long
// values by reference.
type output struct {
	parts [][]byte
	cur   []byte
	n     int
}

func (o *output) byte(c byte) { o.cur = append(o.cur, c); o.n++ }

func (o *output) str(s string) { o.cur = append(o.cur, s...); o.n += len(s) }

// raw appends b, by reference when it is long.
func (o *output) raw(b []byte) {
	o.n += len(b)
	if len(b) < refMin {
		o.cur = append(o.cur, b...)
		return
	}
	o.cut()
	o.parts = append(o.parts, b)
}

// blocks appends a joined value's blocks.
func (o *output) blocks(m *aggMember) {
	for _, b := range m.full {
		o.raw(b)
	}
	o.raw(m.raw)
}

// cut ends the current part of copied pieces.
func (o *output) cut() {
	if len(o.cur) > 0 {
		o.parts = append(o.parts, o.cur)
		o.cur = make([]byte, 0, 512)
	}
}

func (o *output) int(v int) {
	l := len(o.cur)
	o.cur = strconv.AppendInt(o.cur, int64(v), 10)
	o.n += len(o.cur) - l
}

// name appends a member's name and colon; names are written as the
// engine wrote them, once decoded, so they are quoted again here.
func (o *output) name(name string) {
	o.jsonString(name)
	o.byte(':')
}

// jsonString appends s as a JSON string.
func (o *output) jsonString(s string) {
	const hex = "0123456789abcdef"
	l := len(o.cur)
	o.cur = append(o.cur, '"')
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c == '"' || c == '\\':
			o.cur = append(o.cur, '\\', c)
		case c < 0x20:
			o.cur = append(o.cur, '\\', 'u', '0', '0', hex[c>>4], hex[c&15])
		default:
			o.cur = append(o.cur, c)
		}
	}
	o.cur = append(o.cur, '"')
	o.n += len(o.cur) - l
}

// orNone returns m, or none when m is nil.
func orNone(m *aggMember) *aggMember {
	if m == nil {
		return &none
	}
	return m
}

// value appends a member's value.
func (o *output) value(m *aggMember) {
	switch m.kind {
	case kindString:
		o.byte('"')
		o.blocks(m)
		o.byte('"')
	case kindArray:
		o.byte('[')
		o.blocks(m)
		o.byte(']')
	case kindRaw:
		o.raw(m.raw)
	default:
		o.str("null")
	}
}

// members appends ms as members (after a first one when comma).
func (o *output) members(ms []aggMember, comma bool, skip func(string) bool) {
	for i := range ms {
		if skip != nil && skip(ms[i].name) {
			continue
		}
		if comma {
			o.byte(',')
		}
		comma = true
		o.name(ms[i].name)
		o.value(&ms[i])
	}
}

// appendChoices appends the choices array.
func (g *Aggregator) appendChoices(o *output) {
	o.byte('[')
	for i := range g.choices {
		ch := &g.choices[i]
		if i > 0 {
			o.byte(',')
		}
		o.str(`{"index":`)
		o.int(ch.index)
		if g.chat {
			o.str(`,"message":`)
			ch.appendMessage(o)
		} else {
			o.str(`,"text":`)
			if t := lookup(ch.other.ms, "text"); t != nil && t.kind != kindNone {
				o.value(t)
			} else {
				o.str(`""`)
			}
		}
		o.str(`,"logprobs":`)
		if ch.lpObj {
			o.byte('{')
			o.members(ch.lpMembers.ms, false, nil)
			o.byte('}')
		} else {
			o.value(&ch.lpRaw)
		}
		o.str(`,"finish_reason":`)
		o.value(orNone(lookup(ch.other.ms, aggFinishReason)))
		o.members(ch.other.ms, true, func(n string) bool { return n == aggFinishReason || n == "text" })
		o.byte('}')
	}
	o.byte(']')
}

// appendMessage appends a chat choice's message.
func (ch *aggChoice) appendMessage(o *output) {
	o.str(`{"role":`)
	if role := lookup(ch.msg.ms, "role"); role != nil && role.kind != kindNone {
		o.value(role)
	} else {
		o.str(`"assistant"`)
	}
	o.str(`,"content":`)
	o.value(orNone(lookup(ch.msg.ms, "content")))
	o.members(ch.msg.ms, true, func(n string) bool { return n == "role" || n == "content" })
	if len(ch.tools) > 0 {
		ts := ch.tools
		for i := 1; i < len(ts); i++ {
			for j := i; j > 0 && ts[j].index < ts[j-1].index; j-- {
				ts[j], ts[j-1] = ts[j-1], ts[j]
			}
		}
		ch.toolPos = nil // the places moved; rebuilt if the calls grow again
		o.str(`,"tool_calls":[`)
		for i := range ts {
			t := &ts[i]
			if i > 0 {
				o.byte(',')
			}
			o.str(`{"id":`)
			o.value(&t.id)
			o.str(`,"type":`)
			if t.typ.kind == kindNone {
				o.str(`"function"`)
			} else {
				o.value(&t.typ)
			}
			o.str(`,"function":{"name":`)
			o.value(&t.fnName)
			o.str(`,"arguments":`)
			if t.arguments.kind == kindNone {
				o.str(`""`)
			} else {
				o.value(&t.arguments)
			}
			o.str("}}")
		}
		o.byte(']')
	}
	o.byte('}')
}
