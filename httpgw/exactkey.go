package httpgw

import (
	"context"
	"strconv"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/fleet"
	"github.com/examlops/gateway/internal/jsonscan"
	"github.com/examlops/gateway/keys"
	"github.com/examlops/gateway/kvevents"
)

// Keying a request on the exact index: its prompt is tokenized as its
// engine will tokenize it (the engine's own /tokenize, through the
// gateway's cache of tokenized requests), and its tokens are cut into the
// engines' blocks and chained from the model's name, as the Translator
// keys the engines' events (keys.AppendExact). A request the gateway
// cannot key so falls back to its approximate key (see appendKey), whose
// blocks the exact index never holds: it is routed as if nothing were
// cached (by load, for a cache_aware model), and counted by reason.

// tokenizeInput is what decides a request's prompt tokens.
type tokenizeInput struct {
	req kvevents.TokenizeRequest
	// tokens is a completions prompt given as token ids, which needs no
	// tokenizer.
	tokens    []uint32
	hasTokens bool
	// unsupported names what makes the request's tokens unpredictable
	// here, "" if nothing does.
	unsupported string
}

// renderDefault says whether member name of a request changes how its
// engine turns it into tokens and, if it does, the value the gateway's
// tokenization assumes (vLLM's default): a request giving another value
// is not keyed by tokens. A nil default means the member must be absent
// or null.
func renderDefault(kind endpointKind, name string) (def *bool, renders bool) {
	switch name {
	case "add_generation_prompt":
		return ptr(true), kind == endpointChat
	case "continue_final_message":
		return ptr(false), kind == endpointChat
	case "add_special_tokens":
		return ptr(kind == endpointCompletions), true
	case "chat_template", "documents", "mm_processor_kwargs", "prompt_embeds",
		"cache_salt": // salts the engine's block hashes: no hit across salts
		return nil, true
	}
	return nil, false
}

func ptr[T any](v T) *T { return &v }

// readTokenizeInput reads the members of a request body that decide its
// tokens. The body was checked by parseRequest, so syntax errors cannot
// occur; one that did would make the request unsupported.
func readTokenizeInput(kind endpointKind, model string, body []byte) tokenizeInput {
	var in tokenizeInput
	in.req.Model = model
	var r jsonscan.Reader
	r.Reset(body)
	err := r.Object(func(name string) error {
		if def, ok := renderDefault(kind, name); ok {
			if r.Null() {
				return nil
			}
			if def != nil && (r.Peek() == 't' || r.Peek() == 'f') {
				v, err := r.Bool()
				if v != *def {
					in.unsupported = name
				}
				return err
			}
			in.unsupported = name
			return r.Skip()
		}
		switch {
		case name == "messages" && kind == endpointChat:
			in.req.Messages = nil
			if r.Null() {
				return nil
			}
			start := r.Offset()
			err := r.Skip()
			in.req.Messages = r.Since(start)
			return err
		case (name == "tools" || name == "chat_template_kwargs") && kind == endpointChat:
			var raw []byte
			if !r.Null() {
				start := r.Offset()
				if err := r.Skip(); err != nil {
					return err
				}
				raw = r.Since(start)
			}
			if name == "tools" {
				in.req.Tools = raw
			} else {
				in.req.ChatTemplateKwargs = raw
			}
			return nil
		case name == "prompt" && kind == endpointCompletions:
			return in.readPrompt(&r)
		}
		return r.Skip()
	})
	if err != nil {
		in.unsupported = "body"
	}
	if kind == endpointChat {
		in.req.Prompt = ""
	} else {
		in.req.Messages, in.req.Tools, in.req.ChatTemplateKwargs = nil, nil, nil
	}
	return in
}

// readPrompt reads a completions prompt: a string, or one array of token
// ids. Anything else (a list of prompts, a list of token arrays) is
// unsupported: the engine answers each prompt apart.
func (in *tokenizeInput) readPrompt(r *jsonscan.Reader) error {
	in.req.Prompt, in.tokens, in.hasTokens = "", nil, false
	if in.unsupported == "prompt" {
		in.unsupported = ""
	}
	switch r.Peek() {
	case '"':
		s, err := r.String()
		in.req.Prompt = s
		return err
	case '[':
		in.hasTokens = true
		return r.Array(func() error {
			c := r.Peek()
			if c < '0' || c > '9' {
				in.unsupported = "prompt"
				return r.Skip()
			}
			start := r.Offset()
			if err := r.Skip(); err != nil {
				return err
			}
			v, err := strconv.ParseUint(string(r.Since(start)), 10, 32)
			if err != nil {
				in.unsupported = "prompt"
				return nil
			}
			in.tokens = append(in.tokens, uint32(v))
			return nil
		})
	}
	in.unsupported = "prompt"
	return r.Skip()
}

// exactKey appends the call's key on the exact index to dst and says
// whether it fell back to the approximate key, and why (a fallback*
// value, or -1).
func (s *Server) exactKey(c *call, dst gateway.Key) (gateway.Key, int) {
	ms := c.ms
	if c.oc.kind == endpointResponses {
		// The engine's /tokenize takes chat and completions bodies only.
		return s.fallbackKey(c, dst, fleet.FallbackUnsupported)
	}
	in := readTokenizeInput(c.oc.kind, ms.Name, c.body)
	if in.unsupported != "" {
		return s.fallbackKey(c, dst, fleet.FallbackUnsupported)
	}
	tokens := in.tokens
	if !in.hasTokens {
		if in.req.Prompt == "" && len(in.req.Messages) == 0 {
			return s.fallbackKey(c, dst, fleet.FallbackShort) // an empty prompt
		}
		cnt := ms.ExactCounters
		cnt.Tokenize.Add(1)
		ctx, cancel := context.WithTimeout(c.r.Context(), s.opts.TokenizeTimeout)
		start := s.opts.Clock()
		var err error
		tokens, err = s.Tokenizer().Tokenize(ctx, in.req)
		cancel()
		s.metrics.tokenizeSeconds.WithLabelValues(ms.Name).Observe(s.opts.Clock().Sub(start).Seconds())
		if err != nil {
			cnt.Errors.Add(1)
			s.log.Debug("gateway: tokenization failed; routing the request as if nothing were cached", "model", ms.Name, "err", err)
			return s.fallbackKey(c, dst, fleet.FallbackTokenize)
		}
	}
	start := len(dst)
	dst, err := keys.AppendExact(dst, keys.ExactName(ms.Name, c.adapterName()), tokens, ms.ExactBlockSize)
	if err != nil || len(dst) == start {
		return s.fallbackKey(c, dst[:start], fleet.FallbackShort)
	}
	return dst, -1
}

// fallbackKey appends the call's approximate key and counts the fallback.
func (s *Server) fallbackKey(c *call, dst gateway.Key, reason int) (gateway.Key, int) {
	c.ms.ExactCounters.Fallbacks[reason].Add(1)
	start := len(dst)
	dst = appendKey(s.hasher, dst, c.req, c.r.Header)
	keys.Salt(dst[start:], c.adapterName())
	return dst, reason
}
