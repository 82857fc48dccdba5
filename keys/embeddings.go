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
	return decode(body, true)
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
				d.inputErr(fmt.Sprintf("input[%d]", i), "must be a string, a token id or an array of token ids")
				return r.Skip()
			}
			if form == embedUnknown {
				form = got
			}
			if got != form {
				d.inputErr(fmt.Sprintf("input[%d]", i), "must be "+embedForms[form]+", as input[0] is")
				return r.Skip()
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
	d.inputErr("input", "must be a string, an array of strings, an array of token ids or an array of arrays of token ids")
	return r.Skip()
}

// tokenID reads one token id of an embeddings input (field names it): an
// integer.
func (d *requestReader) tokenID(field string) error {
	r := &d.r
	c := r.Peek()
	if c != '-' && (c < '0' || c > '9') {
		d.inputErr(field, "must be an integer (a token id)")
		return r.Skip()
	}
	start := r.Offset()
	if err := r.Skip(); err != nil {
		return err
	}
	if _, err := strconv.ParseInt(string(r.Since(start)), 10, 64); err != nil {
		d.inputErr(field, "must be an integer (a token id)")
	}
	return nil
}

// inputErr records the first type error of "input", at field.
func (d *requestReader) inputErr(field, msg string) {
	if d.typeErr[fieldInput] == nil {
		d.typeErr[fieldInput] = fieldErr(field, field+" "+msg)
	}
}
