package front

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/fleet"
	"github.com/examlops/gateway/internal/jsonscan"
	"github.com/examlops/gateway/keys"
	"github.com/examlops/gateway/kvevents"
)

// DefaultTokenizeTimeout bounds a request's tokenization on the exact
// index when KeyerOptions.TokenizeTimeout is 0.
const DefaultTokenizeTimeout = 2 * time.Second

// Keyer builds requests' keys as both fronts do: the approximate key of
// the request's text (keys.Request.AppendKey, salted with its LoRA
// adapter) or, for a model on the exact index, its key on the engines'
// own blocks. Safe for concurrent use.
//
// Keying a request on the exact index: its prompt is tokenized as its
// engine will tokenize it (the fleet's tokenizer: the engine's own
// /tokenize, through a cache of tokenized requests), and its tokens are
// cut into the engines' blocks and chained from the model's name, as the
// Translator keys the engines' events (keys.AppendExact). A request that
// cannot be keyed so falls back to its approximate key, whose blocks the
// exact index never holds: it is routed as if nothing were cached (by
// load, for a cache_aware model), and counted by reason.
type Keyer struct {
	o      KeyerOptions
	hasher *keys.Hasher
	pool   sync.Pool // *gateway.Key
}

// KeyerOptions configures a Keyer. Fleet and Metrics are required.
type KeyerOptions struct {
	Fleet   *fleet.Fleet // its Tokenizer tokenizes for the exact index
	Metrics *Metrics     // TokenizeSeconds times it
	// BlockSize is the approximate key's block size in bytes; default
	// keys.TextBlockBytes.
	BlockSize int
	// TokenizeTimeout bounds one request's tokenization; default
	// DefaultTokenizeTimeout.
	TokenizeTimeout time.Duration
	Clock           func() time.Time // default time.Now
	Logger          *slog.Logger     // default slog.Default()
}

// NewKeyer returns a Keyer; a bad BlockSize is an error naming it.
func NewKeyer(o KeyerOptions) (*Keyer, error) {
	if o.BlockSize == 0 {
		o.BlockSize = keys.TextBlockBytes
	}
	h, err := keys.NewHasher(o.BlockSize)
	if err != nil {
		return nil, fmt.Errorf("BlockSize: %w", err)
	}
	if o.TokenizeTimeout == 0 {
		o.TokenizeTimeout = DefaultTokenizeTimeout
	}
	if o.Clock == nil {
		o.Clock = time.Now
	}
	if o.Logger == nil {
		o.Logger = slog.Default()
	}
	k := &Keyer{o: o, hasher: h}
	k.pool.New = func() any { b := make(gateway.Key, 0, 256); return &b }
	return k, nil
}

// Buffer returns a pooled key buffer, to be given back with Release.
func (k *Keyer) Buffer() *gateway.Key { return k.pool.Get().(*gateway.Key) }

// Release gives back a buffer of Buffer, holding key (which it keeps).
func (k *Keyer) Release(b *gateway.Key, key gateway.Key) {
	*b = key[:0]
	k.pool.Put(b)
}

// Input is what a request's key is built from.
type Input struct {
	Kind keys.Endpoint
	Body []byte        // the whole body, as the engine gets it
	Req  *keys.Request // Body as Parse read it
	// Session and RAG are the request's keys.HeaderSessionID and
	// keys.HeaderRAGContext headers, "" when absent.
	Session, RAG string
	// Adapter is the LoRA adapter the request names, "" for the base
	// model.
	Adapter string
}

// Key appends the key of a request of ms to dst and says, for a model on
// the exact index, why it fell back to the approximate key (a
// fleet.Fallback* value), -1 if it did not or the model is not on it.
// ctx bounds the tokenization, with KeyerOptions.TokenizeTimeout.
func (k *Keyer) Key(ctx context.Context, dst gateway.Key, ms *fleet.Model, in Input) (gateway.Key, int) {
	if ms.ExactBlockSize > 0 {
		return k.exactKey(ctx, dst, ms, in)
	}
	return keys.Salt(in.Req.AppendKey(k.hasher, dst, in.Session, in.RAG), in.Adapter), -1
}

// exactKey appends the request's key on the exact index to dst.
func (k *Keyer) exactKey(ctx context.Context, dst gateway.Key, ms *fleet.Model, in Input) (gateway.Key, int) {
	if in.Kind == keys.Responses {
		// The engine's /tokenize takes chat and completions bodies only.
		return k.fallbackKey(dst, ms, in, fleet.FallbackUnsupported)
	}
	ti := ReadTokenizeInput(in.Kind, ms.Name, in.Body)
	if ti.Unsupported != "" {
		return k.fallbackKey(dst, ms, in, fleet.FallbackUnsupported)
	}
	tokens := ti.Tokens
	if !ti.HasTokens {
		if ti.Req.Prompt == "" && len(ti.Req.Messages) == 0 {
			return k.fallbackKey(dst, ms, in, fleet.FallbackShort) // an empty prompt
		}
		cnt := ms.ExactCounters
		cnt.Tokenize.Add(1)
		ctx, cancel := context.WithTimeout(ctx, k.o.TokenizeTimeout)
		start := k.o.Clock()
		var err error
		tokens, err = k.o.Fleet.Tokenizer().Tokenize(ctx, ti.Req)
		cancel()
		k.o.Metrics.TokenizeSeconds.WithLabelValues(ms.Name).Observe(k.o.Clock().Sub(start).Seconds())
		if err != nil {
			cnt.Errors.Add(1)
			k.o.Logger.Debug("gateway: tokenization failed; routing the request as if nothing were cached", "model", ms.Name, "err", err)
			return k.fallbackKey(dst, ms, in, fleet.FallbackTokenize)
		}
	}
	start := len(dst)
	dst, err := keys.AppendExact(dst, keys.ExactName(ms.Name, in.Adapter), tokens, ms.ExactBlockSize)
	if err != nil || len(dst) == start {
		return k.fallbackKey(dst[:start], ms, in, fleet.FallbackShort)
	}
	return dst, -1
}

// fallbackKey appends the request's approximate key and counts the
// fallback.
func (k *Keyer) fallbackKey(dst gateway.Key, ms *fleet.Model, in Input, reason int) (gateway.Key, int) {
	ms.ExactCounters.Fallbacks[reason].Add(1)
	start := len(dst)
	dst = in.Req.AppendKey(k.hasher, dst, in.Session, in.RAG)
	keys.Salt(dst[start:], in.Adapter)
	return dst, reason
}

// TokenizeInput is what decides a request's prompt tokens.
type TokenizeInput struct {
	Req kvevents.TokenizeRequest
	// Tokens is a completions prompt given as token ids, which needs no
	// tokenizer; HasTokens says it was.
	Tokens    []uint32
	HasTokens bool
	// Unsupported names what makes the request's tokens unpredictable
	// here, "" if nothing does.
	Unsupported string
}

// renderDefault says whether member name of a request changes how its
// engine turns it into tokens and, if it does, the value the fronts'
// tokenization assumes (vLLM's default): a request giving another value
// is not keyed by tokens. A nil default means the member must be absent
// or null.
func renderDefault(kind keys.Endpoint, name string) (def *bool, renders bool) {
	switch name {
	case "add_generation_prompt":
		return ptr(true), kind == keys.Chat
	case "continue_final_message":
		return ptr(false), kind == keys.Chat
	case "add_special_tokens":
		return ptr(kind == keys.Completions), true
	case "chat_template", "documents", "mm_processor_kwargs", "prompt_embeds",
		"cache_salt": // salts the engine's block hashes: no hit across salts
		return nil, true
	}
	return nil, false
}

func ptr[T any](v T) *T { return &v }

// ReadTokenizeInput reads the members of a request body that decide its
// tokens. The body was checked by Parse, so syntax errors cannot occur;
// one that did would make the request unsupported.
func ReadTokenizeInput(kind keys.Endpoint, model string, body []byte) TokenizeInput {
	var in TokenizeInput
	in.Req.Model = model
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
					in.Unsupported = name
				}
				return err
			}
			in.Unsupported = name
			return r.Skip()
		}
		switch {
		case name == "messages" && kind == keys.Chat:
			in.Req.Messages = nil
			if r.Null() {
				return nil
			}
			start := r.Offset()
			err := r.Skip()
			in.Req.Messages = r.Since(start)
			return err
		case (name == "tools" || name == "chat_template_kwargs") && kind == keys.Chat:
			var raw []byte
			if !r.Null() {
				start := r.Offset()
				if err := r.Skip(); err != nil {
					return err
				}
				raw = r.Since(start)
			}
			if name == "tools" {
				in.Req.Tools = raw
			} else {
				in.Req.ChatTemplateKwargs = raw
			}
			return nil
		case name == "prompt" && kind == keys.Completions:
			return in.readPrompt(&r)
		}
		return r.Skip()
	})
	if err != nil {
		in.Unsupported = "body"
	}
	if kind == keys.Chat {
		in.Req.Prompt = ""
	} else {
		in.Req.Messages, in.Req.Tools, in.Req.ChatTemplateKwargs = nil, nil, nil
	}
	return in
}

// readPrompt reads a completions prompt: a string, or one array of token
// ids. Anything else (a list of prompts, a list of token arrays) is
// unsupported: the engine answers each prompt apart.
func (in *TokenizeInput) readPrompt(r *jsonscan.Reader) error {
	in.Req.Prompt, in.Tokens, in.HasTokens = "", nil, false
	if in.Unsupported == "prompt" {
		in.Unsupported = ""
	}
	switch r.Peek() {
	case '"':
		s, err := r.String()
		in.Req.Prompt = s
		return err
	case '[':
		in.HasTokens = true
		return r.Array(func() error {
			c := r.Peek()
			if c < '0' || c > '9' {
				in.Unsupported = "prompt"
				return r.Skip()
			}
			start := r.Offset()
			if err := r.Skip(); err != nil {
				return err
			}
			v, err := strconv.ParseUint(string(r.Since(start)), 10, 32)
			if err != nil {
				in.Unsupported = "prompt"
				return nil
			}
			in.Tokens = append(in.Tokens, uint32(v))
			return nil
		})
	}
	in.Unsupported = "prompt"
	return r.Skip()
}
