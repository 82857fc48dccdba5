package picker

import (
	"errors"
	"fmt"
	"strings"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/keys"
)

// Headers BodyKey reads, as the HTTP gateway reads them.
const (
	HeaderSessionID  = keys.HeaderSessionID
	HeaderRAGContext = keys.HeaderRAGContext
)

// BodyKey returns a KeyFunc for OpenAI bodies: chat, completions and
// responses requests, read and keyed exactly as the HTTP gateway reads and
// keys them (keys.Parse, keys.Request.AppendKey), so one body gives one key
// whichever front routes it. blockSize is the text block size in bytes
// (keys.TextBlockBytes is the gateway's).
//
// The endpoint is the request's path (see parse). The body must be one the endpoint accepts (ErrBadRequest naming
// the field otherwise), and its "model", if models are given, one of them
// (else ErrUnknownModel). A request with no body gets a one-block key
// naming its method and path.
func BodyKey(blockSize int, models ...string) (KeyFunc, error) {
	h, err := keys.NewHasher(blockSize)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrInvalidOptions, err)
	}
	served := map[string]bool{}
	for _, m := range models {
		served[m] = true
	}
	return func(dst gateway.Key, req *PickRequest) (gateway.Key, error) {
		if req.Body == nil {
			return h.AppendSegment(dst, keys.SegmentOther, "\x00"+req.Method+" "+req.Path), nil
		}
		b, err := parse(req.Path, req.Body)
		if err != nil {
			return dst, fmt.Errorf("%w: %w", ErrBadRequest, err)
		}
		if len(served) > 0 && !served[b.Model] {
			return dst, fmt.Errorf("%w: model %q is not served (models: %s)", ErrUnknownModel, b.Model, strings.Join(models, ", "))
		}
		return b.AppendKey(h, dst, req.Header.Get(HeaderSessionID), req.Header.Get(HeaderRAGContext)), nil
	}, nil
}

// parse reads body as a request to path: /v1/chat/completions,
// /v1/completions or /v1/responses; for another path (a data plane may
// rewrite it, or send none), as whichever of the three the body is (chat,
// else completions, else responses), as GIE's picker reads a body of any.
func parse(path string, body []byte) (*keys.Request, error) {
	if i := strings.IndexByte(path, '?'); i >= 0 {
		path = path[:i]
	}
	switch path {
	case "/v1/chat/completions":
		return keys.Parse(keys.Chat, body)
	case "/v1/completions":
		return keys.Parse(keys.Completions, body)
	case "/v1/responses":
		return keys.Parse(keys.Responses, body)
	}
	r, err := keys.Parse(keys.Chat, body)
	var fe *keys.FieldError
	for _, e := range []keys.Endpoint{keys.Completions, keys.Responses} {
		if !errors.As(err, &fe) || fe.Field != "messages" && fe.Field != "prompt" {
			break
		}
		r, err = keys.Parse(e, body)
	}
	return r, err
}
