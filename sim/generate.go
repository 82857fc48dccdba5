package sim

import (
	"fmt"
	"math/rand/v2"
)

// Block-id spaces keep the generated workloads' contents apart.
const (
	spaceSystem uint64 = iota + 1
	spaceQuestion
	spaceDoc
	spaceUser
	spaceAnswer
	spaceUnique
)

// blockBuilder cuts a prompt made of segments into blocks and gives each
// block an id derived from the content it covers, so that two prompts get
// the same id for a block exactly when that block covers the same content.
type blockBuilder struct {
	bt   int
	ids  []uint64
	acc  uint64
	fill int
}

func (b *blockBuilder) reset(bt int, ids []uint64) {
	b.bt, b.ids, b.acc, b.fill = bt, ids[:0], 0, 0
}

// add appends tokens of content seg.
func (b *blockBuilder) add(seg uint64, tokens int) {
	for off := 0; off < tokens; {
		n := min(b.bt-b.fill, tokens-off)
		b.acc = mix(b.acc ^ mix(seg^uint64(off)<<20^uint64(n)))
		b.fill += n
		off += n
		if b.fill == b.bt {
			b.ids = append(b.ids, b.acc)
			b.acc, b.fill = 0, 0
		}
	}
}

// finish appends the partial last block, if any, and returns the ids.
func (b *blockBuilder) finish() []uint64 {
	if b.fill > 0 {
		b.ids = append(b.ids, b.acc)
		b.acc, b.fill = 0, 0
	}
	return b.ids
}

func content(space, item uint64) uint64 { return mix(space<<56 ^ mix(item)) }

// SharedPrefixConfig configures SharedPrefix. Zero fields take the defaults
// given, which are SGLang's bench_serving "generated-shared-prefix" defaults.
type SharedPrefixConfig struct {
	// Requests in all; default Groups×16 (1,024).
	Requests int
	// Rate of Poisson arrivals per second; default 32.
	Rate float64
	// Groups of requests sharing a system prompt; default 64.
	Groups int
	// SystemTokens per system prompt; default 2048.
	SystemTokens int
	// QuestionTokens per request, distinct for every request; default 128.
	QuestionTokens int
	// OutputTokens per request; default 256.
	OutputTokens int
	// BlockTokens per KV block; default 128.
	BlockTokens int
}

// SharedPrefix returns groups of requests that share a system prompt and
// differ in their question; every request picks its group uniformly at
// random.
func SharedPrefix(c SharedPrefixConfig) (Workload, error) {
	c.Groups = orDefault(c.Groups, 64)
	c.Requests = orDefault(c.Requests, c.Groups*16)
	c.Rate = orDefault(c.Rate, 32)
	c.SystemTokens = orDefault(c.SystemTokens, 2048)
	c.QuestionTokens = orDefault(c.QuestionTokens, 128)
	c.OutputTokens = orDefault(c.OutputTokens, 256)
	c.BlockTokens = orDefault(c.BlockTokens, 128)
	if err := checkGen("shared-prefix", c.Requests, c.Rate, "Groups", c.Groups, "SystemTokens", c.SystemTokens,
		"QuestionTokens", c.QuestionTokens, "OutputTokens", c.OutputTokens, "BlockTokens", c.BlockTokens); err != nil {
		return nil, err
	}
	return &sharedPrefix{c}, nil
}

type sharedPrefix struct{ c SharedPrefixConfig }

func (w *sharedPrefix) Name() string {
	c := w.c
	return fmt.Sprintf("shared-prefix: %d requests, Poisson %g/s, %d groups × %d-token system prompt + %d-token question, %d-token output",
		c.Requests, c.Rate, c.Groups, c.SystemTokens, c.QuestionTokens, c.OutputTokens)
}
func (w *sharedPrefix) BlockTokens() int { return w.c.BlockTokens }

func (w *sharedPrefix) Open(seed uint64) (Stream, error) {
	c := w.c
	rng := newRand(seed, 1)
	var b blockBuilder
	return newGenStream("shared-prefix", c.Requests, c.Rate, rng, func(r *Request, q uint64) {
		g := rng.IntN(c.Groups)
		b.reset(c.BlockTokens, r.Blocks)
		b.add(content(spaceSystem, uint64(g)), c.SystemTokens)
		b.add(content(spaceQuestion, q), c.QuestionTokens)
		r.Blocks, r.OutBlocks = b.finish(), r.OutBlocks[:0]
		r.InputTokens, r.OutputTokens = c.SystemTokens+c.QuestionTokens, c.OutputTokens
		r.UserBlock = c.SystemTokens / c.BlockTokens
	}), nil
}

// DefaultWorkload returns the embedded default workload: 20,000 requests
// arriving Poisson at 40 per second, each one of 256 system prompts of 4,096
// tokens (1.05M tokens of prefixes, more than one 8b-h100 replica's
// 410k-token cache but less than 4 replicas' together) followed by a
// distinct 128-token question, with 256 output tokens. Routing decides the
// hit rate: a replica can hold only about 100 of the 256 prefixes.
func DefaultWorkload() Workload {
	w, err := SharedPrefix(SharedPrefixConfig{Requests: 20000, Rate: 40, Groups: 256, SystemTokens: 4096, QuestionTokens: 128, OutputTokens: 256})
	if err != nil {
		panic(err)
	}
	return w
}

// ChatConfig configures Chat. Token counts must be multiples of
// BlockTokens, so that each turn's prompt extends the previous turn's prompt
// and answer block for block.
type ChatConfig struct {
	// Requests (turns) in all; default 10,000.
	Requests int
	// Rate of Poisson arrivals per second; default 20.
	Rate float64
	// Sessions open at once; each arrival is the next turn of one of them,
	// picked uniformly at random. Default 200.
	Sessions int
	// Turns per session, after which it is replaced by a new one; default 8.
	Turns int
	// SystemTokens of the system prompt every session shares; default 512.
	SystemTokens int
	// UserTokens per user message; default 256.
	UserTokens int
	// AnswerTokens per answer (the output length); default 256.
	AnswerTokens int
	// BlockTokens per KV block; default 128.
	BlockTokens int
}

// Chat returns multi-turn chat sessions: each turn's prompt is the previous
// turn's prompt and answer plus a new user message, and answers are cached
// once generated (Request.OutBlocks).
func Chat(c ChatConfig) (Workload, error) {
	c.Requests = orDefault(c.Requests, 10000)
	c.Rate = orDefault(c.Rate, 20)
	c.Sessions = orDefault(c.Sessions, 200)
	c.Turns = orDefault(c.Turns, 8)
	c.SystemTokens = orDefault(c.SystemTokens, 512)
	c.UserTokens = orDefault(c.UserTokens, 256)
	c.AnswerTokens = orDefault(c.AnswerTokens, 256)
	c.BlockTokens = orDefault(c.BlockTokens, 128)
	if err := checkGen("chat", c.Requests, c.Rate, "Sessions", c.Sessions, "Turns", c.Turns, "SystemTokens", c.SystemTokens,
		"UserTokens", c.UserTokens, "AnswerTokens", c.AnswerTokens, "BlockTokens", c.BlockTokens); err != nil {
		return nil, err
	}
	for _, f := range []struct {
		n string
		v int
	}{{"SystemTokens", c.SystemTokens}, {"UserTokens", c.UserTokens}, {"AnswerTokens", c.AnswerTokens}} {
		if f.v%c.BlockTokens != 0 {
			return nil, fmt.Errorf("%w: chat: %s %d is not a multiple of BlockTokens %d", ErrInvalidConfig, f.n, f.v, c.BlockTokens)
		}
	}
	return &chat{c}, nil
}

type chat struct{ c ChatConfig }

func (w *chat) Name() string {
	c := w.c
	return fmt.Sprintf("chat: %d turns, Poisson %g/s, %d open sessions × %d turns, %d-token shared system prompt, %d-token messages, %d-token answers",
		c.Requests, c.Rate, c.Sessions, c.Turns, c.SystemTokens, c.UserTokens, c.AnswerTokens)
}
func (w *chat) BlockTokens() int { return w.c.BlockTokens }

type session struct {
	id   uint64
	turn int
	ids  []uint64
}

func (w *chat) Open(seed uint64) (Stream, error) {
	c := w.c
	rng := newRand(seed, 2)
	bt := c.BlockTokens
	next := uint64(0)
	sess := make([]session, c.Sessions)
	start := func(s *session) {
		next++
		s.id, s.turn = next, 0
		s.ids = appendIDs(s.ids[:0], spaceSystem, 0, c.SystemTokens/bt)
	}
	for i := range sess {
		start(&sess[i])
	}
	return newGenStream("chat", c.Requests, c.Rate, rng, func(r *Request, _ uint64) {
		s := &sess[rng.IntN(len(sess))]
		if s.turn == c.Turns {
			start(s)
		}
		s.turn++
		item := s.id<<8 | uint64(s.turn)
		s.ids = appendIDs(s.ids, spaceUser, item, c.UserTokens/bt)
		r.Blocks = append(r.Blocks[:0], s.ids...)
		r.InputTokens = len(s.ids) * bt
		r.OutputTokens = c.AnswerTokens
		r.UserBlock = c.SystemTokens / bt
		s.ids = appendIDs(s.ids, spaceAnswer, item, c.AnswerTokens/bt)
		r.OutBlocks = append(r.OutBlocks[:0], s.ids[len(r.Blocks):]...)
	}), nil
}

// RAGConfig configures RAG.
type RAGConfig struct {
	// Requests in all; default 10,000.
	Requests int
	// Rate of Poisson arrivals per second; default 20.
	Rate float64
	// Documents in the corpus; default 2,000.
	Documents int
	// DocTokens per document; default 1,024.
	DocTokens int
	// DocsPerPrompt retrieved per request, placed in the order drawn;
	// default 2.
	DocsPerPrompt int
	// Zipf exponent of document popularity, above 1; default 1.1.
	Zipf float64
	// SystemTokens of the shared instructions before the documents;
	// default 256.
	SystemTokens int
	// QuestionTokens after the documents, distinct per request; default 64.
	QuestionTokens int
	// OutputTokens per request; default 256.
	OutputTokens int
	// BlockTokens per KV block; default 128.
	BlockTokens int
}

// RAG returns retrieval-augmented requests: shared instructions, then
// DocsPerPrompt documents drawn by Zipf-distributed popularity, then a
// question. Only the leading document extends a shared prefix; the KV of
// later ones depends on what precedes them.
func RAG(c RAGConfig) (Workload, error) {
	c.Requests = orDefault(c.Requests, 10000)
	c.Rate = orDefault(c.Rate, 20)
	c.Documents = orDefault(c.Documents, 2000)
	c.DocTokens = orDefault(c.DocTokens, 1024)
	c.DocsPerPrompt = orDefault(c.DocsPerPrompt, 2)
	c.Zipf = orDefault(c.Zipf, 1.1)
	c.SystemTokens = orDefault(c.SystemTokens, 256)
	c.QuestionTokens = orDefault(c.QuestionTokens, 64)
	c.OutputTokens = orDefault(c.OutputTokens, 256)
	c.BlockTokens = orDefault(c.BlockTokens, 128)
	if err := checkGen("rag", c.Requests, c.Rate, "Documents", c.Documents, "DocTokens", c.DocTokens, "DocsPerPrompt", c.DocsPerPrompt,
		"SystemTokens", c.SystemTokens, "QuestionTokens", c.QuestionTokens, "OutputTokens", c.OutputTokens, "BlockTokens", c.BlockTokens); err != nil {
		return nil, err
	}
	if !(c.Zipf > 1) {
		return nil, fmt.Errorf("%w: rag: Zipf %v must be above 1", ErrInvalidConfig, c.Zipf)
	}
	return &rag{c}, nil
}

type rag struct{ c RAGConfig }

func (w *rag) Name() string {
	c := w.c
	return fmt.Sprintf("rag: %d requests, Poisson %g/s, %d of %d documents × %d tokens (Zipf %g) after a %d-token system prompt, %d-token question, %d-token output",
		c.Requests, c.Rate, c.DocsPerPrompt, c.Documents, c.DocTokens, c.Zipf, c.SystemTokens, c.QuestionTokens, c.OutputTokens)
}
func (w *rag) BlockTokens() int { return w.c.BlockTokens }

func (w *rag) Open(seed uint64) (Stream, error) {
	c := w.c
	rng := newRand(seed, 3)
	zipf := rand.NewZipf(rng, c.Zipf, 1, uint64(c.Documents-1))
	var b blockBuilder
	return newGenStream("rag", c.Requests, c.Rate, rng, func(r *Request, q uint64) {
		b.reset(c.BlockTokens, r.Blocks)
		b.add(content(spaceSystem, 1), c.SystemTokens)
		for range c.DocsPerPrompt {
			b.add(content(spaceDoc, zipf.Uint64()), c.DocTokens)
		}
		b.add(content(spaceQuestion, q), c.QuestionTokens)
		r.Blocks, r.OutBlocks = b.finish(), r.OutBlocks[:0]
		r.InputTokens = c.SystemTokens + c.DocsPerPrompt*c.DocTokens + c.QuestionTokens
		r.OutputTokens = c.OutputTokens
		r.UserBlock = c.SystemTokens / c.BlockTokens
	}), nil
}

// SystemPromptConfig configures SystemPrompt.
type SystemPromptConfig struct {
	// Requests in all; default 10,000.
	Requests int
	// Rate of Poisson arrivals per second; default 40.
	Rate float64
	// SystemTokens of the one system prompt every request shares; default 2,048.
	SystemTokens int
	// UserTokens after it, distinct per request; default 512.
	UserTokens int
	// OutputTokens per request; default 128.
	OutputTokens int
	// BlockTokens per KV block; default 128.
	BlockTokens int
}

// SystemPrompt returns requests that all share one system prompt and differ
// after it: the collapse trap, where a policy that follows the longest match
// alone sends everything to one replica.
func SystemPrompt(c SystemPromptConfig) (Workload, error) {
	c.Requests = orDefault(c.Requests, 10000)
	c.Rate = orDefault(c.Rate, 40)
	c.SystemTokens = orDefault(c.SystemTokens, 2048)
	c.UserTokens = orDefault(c.UserTokens, 512)
	c.OutputTokens = orDefault(c.OutputTokens, 128)
	c.BlockTokens = orDefault(c.BlockTokens, 128)
	if err := checkGen("system-prompt", c.Requests, c.Rate, "SystemTokens", c.SystemTokens, "UserTokens", c.UserTokens,
		"OutputTokens", c.OutputTokens, "BlockTokens", c.BlockTokens); err != nil {
		return nil, err
	}
	return &systemPrompt{c}, nil
}

type systemPrompt struct{ c SystemPromptConfig }

func (w *systemPrompt) Name() string {
	c := w.c
	return fmt.Sprintf("system-prompt: %d requests, Poisson %g/s, one %d-token system prompt shared by all + %d distinct tokens, %d-token output",
		c.Requests, c.Rate, c.SystemTokens, c.UserTokens, c.OutputTokens)
}
func (w *systemPrompt) BlockTokens() int { return w.c.BlockTokens }

func (w *systemPrompt) Open(seed uint64) (Stream, error) {
	c := w.c
	rng := newRand(seed, 4)
	var b blockBuilder
	return newGenStream("system-prompt", c.Requests, c.Rate, rng, func(r *Request, q uint64) {
		b.reset(c.BlockTokens, r.Blocks)
		b.add(content(spaceSystem, 7), c.SystemTokens)
		b.add(content(spaceUser, q), c.UserTokens)
		r.Blocks, r.OutBlocks = b.finish(), r.OutBlocks[:0]
		r.InputTokens, r.OutputTokens = c.SystemTokens+c.UserTokens, c.OutputTokens
		r.UserBlock = c.SystemTokens / c.BlockTokens
	}), nil
}

// LowSharingConfig configures LowSharing.
type LowSharingConfig struct {
	// Requests in all; default 10,000.
	Requests int
	// Rate of Poisson arrivals per second; default 40.
	Rate float64
	// InputTokens per request; default 2,048.
	InputTokens int
	// OutputTokens per request; default 256.
	OutputTokens int
	// Reuse is the fraction of requests, 0..1, that repeat one of 64 popular
	// prompts; the rest are unique. Default 0.02.
	Reuse float64
	// BlockTokens per KV block; default 128.
	BlockTokens int
}

// LowSharing returns requests with almost no reuse: unique prompts, but for
// a small fraction repeating a few popular ones. Cache-aware routing has
// nothing to gain here and must not lose to load-aware routing.
func LowSharing(c LowSharingConfig) (Workload, error) {
	c.Requests = orDefault(c.Requests, 10000)
	c.Rate = orDefault(c.Rate, 40)
	c.InputTokens = orDefault(c.InputTokens, 2048)
	c.OutputTokens = orDefault(c.OutputTokens, 256)
	c.Reuse = orDefault(c.Reuse, 0.02)
	c.BlockTokens = orDefault(c.BlockTokens, 128)
	if err := checkGen("low-sharing", c.Requests, c.Rate, "InputTokens", c.InputTokens, "OutputTokens", c.OutputTokens, "BlockTokens", c.BlockTokens); err != nil {
		return nil, err
	}
	if c.Reuse < 0 || c.Reuse > 1 {
		return nil, fmt.Errorf("%w: low-sharing: Reuse %v must be within 0..1", ErrInvalidConfig, c.Reuse)
	}
	return &lowSharing{c}, nil
}

type lowSharing struct{ c LowSharingConfig }

func (w *lowSharing) Name() string {
	c := w.c
	return fmt.Sprintf("low-sharing: %d requests, Poisson %g/s, %d-token prompts, %.0f%% repeating one of 64, %d-token output",
		c.Requests, c.Rate, c.InputTokens, 100*c.Reuse, c.OutputTokens)
}
func (w *lowSharing) BlockTokens() int { return w.c.BlockTokens }

func (w *lowSharing) Open(seed uint64) (Stream, error) {
	c := w.c
	rng := newRand(seed, 5)
	var b blockBuilder
	return newGenStream("low-sharing", c.Requests, c.Rate, rng, func(r *Request, q uint64) {
		item := content(spaceUnique, q)
		if rng.Float64() < c.Reuse {
			item = content(spaceSystem, 1000+uint64(rng.IntN(64)))
		}
		b.reset(c.BlockTokens, r.Blocks)
		b.add(item, c.InputTokens)
		r.Blocks, r.OutBlocks = b.finish(), r.OutBlocks[:0]
		r.InputTokens, r.OutputTokens = c.InputTokens, c.OutputTokens
		r.UserBlock = 0
	}), nil
}

// WorkloadNames lists the names NewWorkload accepts.
func WorkloadNames() []string {
	return []string{"default", "shared-prefix", "chat", "rag", "system-prompt", "low-sharing", "lora"}
}

// FlowWorkloadNames lists the multi-tenant workloads NewWorkload also
// accepts, with their defaults (see NoisyNeighbour, InteractiveBatch,
// SLOClasses).
func FlowWorkloadNames() []string {
	return []string{"noisy-neighbour", "interactive-batch", "slo-classes"}
}

// NewWorkload returns the generated workload called name (see
// WorkloadNames and FlowWorkloadNames) with its defaults, overriding the request count and rate
// when they are positive. Trace files are opened with TraceFile.
func NewWorkload(name string, requests int, rate float64) (Workload, error) {
	switch name {
	case "default":
		if requests == 0 && rate == 0 {
			return DefaultWorkload(), nil
		}
		return SharedPrefix(SharedPrefixConfig{Requests: orDefault(requests, 20000), Rate: orDefault(rate, 40), Groups: 256, SystemTokens: 4096, QuestionTokens: 128, OutputTokens: 256})
	case "shared-prefix":
		return SharedPrefix(SharedPrefixConfig{Requests: requests, Rate: rate})
	case "chat":
		return Chat(ChatConfig{Requests: requests, Rate: rate})
	case "rag":
		return RAG(RAGConfig{Requests: requests, Rate: rate})
	case "system-prompt":
		return SystemPrompt(SystemPromptConfig{Requests: requests, Rate: rate})
	case "low-sharing":
		return LowSharing(LowSharingConfig{Requests: requests, Rate: rate})
	case "lora":
		return LoRAWorkload(LoRAConfig{Requests: requests, Rate: rate})
	case "noisy-neighbour":
		return NoisyNeighbour(requests, rate, 0, 0, "")
	case "interactive-batch":
		return InteractiveBatch(requests, rate, "")
	case "slo-classes":
		return SLOClasses(requests, rate, nil)
	}
	return nil, fmt.Errorf("%w: workload %q unknown (have %v)", ErrInvalidConfig, name, append(WorkloadNames(), FlowWorkloadNames()...))
}
