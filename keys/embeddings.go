package keys

import (
	"fmt"
	"strconv"
)

// DecodeEmbeddings is Decode for a body of the pass-through endpoints
// (/v1/embeddings, /tokenize, /detokenize), whose "input" is an
// embeddings input, one of the forms OpenAI's and vLLM's embeddings
// endpoints take: a string, an array of strings, an array of token ids
// (integers), or an array of arrays of token ids. Any other "input" is a
// *FieldError naming the element at fault ("input[1]", "input[0][2]");
// null is no input. The input is checked, not kept: a pass-through
// request has no prefix key.
func DecodeEmbeddings(body []byte) (*Request, error) {
	return decode(body, true, false)
}

// The forms of an embeddings input array, set by its first element.
const (
	embedUnknown = iota // empty so far
	embedStrings
	embedTokens
	embedTokenLists
)

// embedForms names each form for errors.
var embedForms = [...]string{"", "a string", "an integer (a token id)", "an array of token ids"}

// embeddingsInput reads an embeddings request's "input" (see
// DecodeEmbeddings).
func (d *requestReader) embeddingsInput() error {
	r := &d.r
	d.typeErr[fieldInput] = nil
	d.req.hasInput = false
	switch r.Peek() {
	case 'n':
		if r.Null() {
			return nil
		}
	case '"':
		d.req.hasInput = true
		_, err := r.String()
		return err
	case '[':
		d.req.hasInput = true
		form, i := embedUnknown, 0
		return r.Array(func() error {
			defer func() { i++ }()
			var got int
			switch c := r.Peek(); {
			case c == '"':
				got = embedStrings
			case c == '-' || c >= '0' && c <= '9':
				got = embedTokens
			case c == '[':
				got = embedTokenLists
			default:
				return d.badInput(fmt.Sprintf("input[%d]", i), "must be a string, a token id or an array of token ids")
			}
			if form == embedUnknown {
				form = got
			}
			if got != form {
				return d.badInput(fmt.Sprintf("input[%d]", i), "must be "+embedForms[form]+" as input[0] is")
			}
			switch form {
			case embedStrings:
				_, err := r.String()
				return err
			case embedTokens:
				return d.tokenID(fmt.Sprintf("input[%d]", i))
			}
			j := 0
			return r.Array(func() error {
				defer func() { j++ }()
				return d.tokenID(fmt.Sprintf("input[%d][%d]", i, j))
			})
		})
	}
	return d.badInput("input", "must be a string, an array of strings, an array of token ids or an array of arrays of token ids")
}

// tokenID reads one token id of an embeddings input (field names it): an
// integer.
func (d *requestReader) tokenID(field string) error {
	r := &d.r
	c := r.Peek()
	if c != '-' && (c < '0' || c > '9') {
		return d.badInput(field, "must be an integer (a token id)")
	}
	start := r.Offset()
	if err := r.Skip(); err != nil {
		return err
	}
	if _, err := strconv.ParseInt(string(r.Since(start)), 10, 64); err != nil && d.typeErr[fieldInput] == nil {
		d.typeErr[fieldInput] = fieldErr(field, field+" must be an integer (a token id), not "+describe(r.Since(start)))
	}
	return nil
}

// badInput skips the next value, of the wrong type for field (in
// "input"), and records the error saying so (badValue) if it is the
// first of "input".
func (d *requestReader) badInput(field, msg string) error {
	terr, err := d.badValue(field, field+" "+msg)
	if d.typeErr[fieldInput] == nil {
		d.typeErr[fieldInput] = terr
	}
	return err
}
