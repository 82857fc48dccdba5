package config

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strconv"
	"strings"
	"unicode"

	"github.com/examlops/gateway"
)

// shape is the JSON layout of a configuration file, which checkShape holds
// a document to before encoding/json decodes it. Exactly one of fields,
// values and elems is set for an object or array; none for a scalar.
type shape struct {
	// fields: an object with exactly these keys allowed (a struct).
	fields map[string]*shape
	// values: an object with any keys, each value of this shape (a map).
	values *shape
	// elems: an array of this shape.
	elems *shape
	// text, for a scalar: when the value is a string, the reason it is not
	// acceptable, "" if it is.
	text func(string) string
	// kind, for a scalar: the JSON value its Go field takes; 0 for any.
	kind scalarKind
}

// scalarKind is the kind of JSON scalar a field takes.
type scalarKind int

const (
	_          scalarKind = iota
	kindString            // a string
	kindBool              // true or false
	kindInt               // a whole number in int64's range (an int or int64 field)
	kindFloat             // a number in float64's range
)

// want names what a scalar of kind k must be, for error messages.
func (k scalarKind) want() string {
	switch k {
	case kindString:
		return "a string"
	case kindBool:
		return "a boolean"
	case kindInt:
		return "a whole number"
	case kindFloat:
		return "a number"
	}
	return "a string, number or boolean"
}

// scalarProblem returns, for a scalar token (a string, json.Number or
// bool) of the wrong kind for s or out of its range, what it is and what
// is wanted; "" when it fits. encoding/json rejects the same values, but
// names them without their model and index.
func (s *shape) scalarProblem(at string, tok json.Token) string {
	var ok bool
	var what string
	want := s.kind.want()
	switch v := tok.(type) {
	case string:
		ok, what = s.kind == 0 || s.kind == kindString, "a string "+strconv.Quote(v)
	case bool:
		ok, what = s.kind == 0 || s.kind == kindBool, "the boolean "+strconv.FormatBool(v)
	case json.Number:
		what = "the number " + string(v)
		switch s.kind {
		case kindString, kindBool:
		case kindInt:
			_, err := strconv.ParseInt(string(v), 10, 64)
			ok = err == nil
			if !strings.ContainsAny(string(v), ".eE") {
				want = fmt.Sprintf("a whole number from %d to %d", math.MinInt64, math.MaxInt64)
			}
		case kindFloat:
			_, err := strconv.ParseFloat(string(v), 64)
			ok, want = err == nil, "a number within float64's range"
		default:
			ok = true
		}
	default:
		return ""
	}
	if ok {
		return ""
	}
	return fmt.Sprintf("%s is %s, want %s", at, what, want)
}

// fileShape is the layout of [File].
var fileShape = func() *shape {
	str, boolean, integer, float := &shape{kind: kindString}, &shape{kind: kindBool}, &shape{kind: kindInt}, &shape{kind: kindFloat}
	replica := &shape{fields: map[string]*shape{"name": str, "address": str, "cache_blocks": integer, "kv_events": str, "kv_events_replay": str, "pod": str}}
	replicas := &shape{elems: replica}
	mode := &shape{kind: kindString, text: func(s string) string {
		var m gateway.Mode
		if m.UnmarshalText([]byte(s)) != nil {
			return "want " + modeChoices()
		}
		return ""
	}}
	model := &shape{fields: map[string]*shape{
		"mode": mode, "slo_latency_ms": integer, "disaggregate": boolean,
		"prefill_pool": str, "decode_pool": str, "pd_mode": str, "engine": str, "pd_min_uncached_tokens": integer,
		"index": str, "block_size": integer, "kv_events_bind": str,
		"adapters":        {elems: str},
		"peers":           {elems: str},
		"kv_events_allow": {elems: str},
		"load_weights":    {fields: map[string]*shape{"queue": float, "kv": float, "latency": float}},
		"replicas":        replicas,
		"pools":           {values: replicas},
	}}
	return &shape{fields: map[string]*shape{"version": integer, "models": {values: model}}}
}()

// what names the kind of JSON value s stands for, for error messages.
func (s *shape) what() string {
	switch {
	case s.fields != nil || s.values != nil:
		return "an object"
	case s.elems != nil:
		return "an array"
	}
	return "a string, number or boolean"
}

// checkShape holds a syntactically valid JSON document to fileShape,
// rejecting what encoding/json would let through silently or report
// without a path: a document that is not an object, null anywhere (a
// field that is not wanted is left out), a key given twice (encoding/json
// keeps the last), a key that matches a field only when case is ignored
// (encoding/json accepts it), an unknown key, and an object or array where
// another kind of value belongs. The error names the value's path, e.g.
// models.JPCP.replicas[0].adress. A mode name that is not a mode is a
// *FieldError naming its path; other scalars' types and values are left to
// encoding/json and Validate.
func checkShape(data []byte) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	return walkShape(dec, fileShape, "")
}

// walkShape consumes one value from dec and checks it against s; path is
// the value's path ("" for the document). Its recursion follows s, so its
// depth is bounded by fileShape's whatever the input.
func walkShape(dec *json.Decoder, s *shape, path string) error {
	tok, err := dec.Token()
	if err != nil {
		return err
	}
	at := path
	if at == "" {
		at = "the document"
	}
	delim, isDelim := tok.(json.Delim)
	switch {
	case tok == nil:
		if path == "" {
			return fmt.Errorf("the document is null, want an object")
		}
		return fmt.Errorf("%s is null; leave the field out instead", at)
	case !isDelim && s.what() != (&shape{}).what():
		return fmt.Errorf("%s is %s, want %s", at, describeToken(tok), s.what())
	case !isDelim:
		if p := s.scalarProblem(at, tok); p != "" {
			return errors.New(p)
		}
		if str, ok := tok.(string); ok && s.text != nil {
			if reason := s.text(str); reason != "" {
				return &FieldError{Field: path, Value: str, Reason: reason}
			}
		}
		return nil
	case delim == '[' && s.elems == nil:
		return fmt.Errorf("%s is an array, want %s", at, s.what())
	case delim == '{' && s.fields == nil && s.values == nil:
		return fmt.Errorf("%s is an object, want %s", at, s.what())
	case delim == '[':
		for i := 0; dec.More(); i++ {
			if err := walkShape(dec, s.elems, fmt.Sprintf("%s[%d]", path, i)); err != nil {
				return err
			}
		}
		_, err := dec.Token() // ]
		return err
	}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return err
		}
		key, _ := tok.(string)
		child := joinPath(path, key)
		if seen[key] {
			return fmt.Errorf("%s is given twice", child)
		}
		seen[key] = true
		next := s.values
		if s.fields != nil {
			if next = s.fields[key]; next == nil {
				return unknownField(s, at, child, key)
			}
		}
		if err := walkShape(dec, next, child); err != nil {
			return err
		}
	}
	_, err = dec.Token() // }
	return err
}

// unknownField reports key as not a field of the object at at, suggesting
// the field it matches when case is ignored, else listing the fields.
func unknownField(s *shape, at, child, key string) error {
	names := slices.Sorted(maps.Keys(s.fields))
	for _, n := range names {
		if strings.EqualFold(n, key) {
			return fmt.Errorf("unknown field %s (field names are case-sensitive: did you mean %q?)", child, n)
		}
	}
	return fmt.Errorf("unknown field %s; the fields of %s are %s", child, at, strings.Join(names, ", "))
}

// joinPath appends key to a dotted path, quoting it when it is empty or
// holds a dot, a quote, a space or a character that is not printable, so
// that paths stay unambiguous and safe to print.
func joinPath(path, key string) string {
	if key == "" || strings.ContainsAny(key, `."[]`) || strings.IndexFunc(key, func(r rune) bool { return r == ' ' || !unicode.IsPrint(r) }) >= 0 {
		key = strconv.Quote(key)
	}
	if path == "" {
		return key
	}
	return path + "." + key
}

// describeToken names a scalar JSON token's kind.
func describeToken(tok json.Token) string {
	switch tok.(type) {
	case string:
		return "a string"
	case json.Number:
		return "a number"
	case bool:
		return "a boolean"
	}
	return "a value"
}
