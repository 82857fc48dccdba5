package jsonscan

import "bytes"

// This file rewrites a JSON object's top-level members as text: every
// member kept stays byte for byte and in order, so numbers keep their
// precision and a reader gets what the writer wrote. The HTTP gateway's
// P/D request bodies and both fronts' streamed-upstream bodies are
// rewritten so.

// Member is one top-level member of a JSON object: its decoded name, and
// its name and value as written.
type Member struct {
	Name         string
	RawName, Raw []byte
}

// Members returns the members of the JSON object b, which must be the
// whole document; its errors wrap ErrSyntax.
func Members(b []byte) ([]Member, error) {
	var r Reader
	r.Reset(b)
	if r.Peek() != '{' {
		return nil, r.Errorf("want '{'")
	}
	prev := r.Offset() + 1 // just after the '{'
	var out []Member
	err := r.Object(func(name string) error {
		// b[prev:valStart-1] is [ws][,][ws]"name"[ws]; the ':' is at valStart-1.
		valStart := r.Offset()
		if err := r.Skip(); err != nil {
			return err
		}
		head := bytes.TrimSpace(b[prev : valStart-1])
		head = bytes.TrimSpace(bytes.TrimPrefix(head, []byte(",")))
		out = append(out, Member{Name: name, RawName: head, Raw: bytes.TrimSpace(b[valStart:r.Offset()])})
		prev = r.Offset()
		return nil
	})
	if err != nil {
		return nil, err
	}
	if !r.End() {
		return nil, r.Errorf("data after the object")
	}
	return out, nil
}

// Rewrite returns the object b without the members named in drop (a
// repeated one everywhere), with tail (members in JSON, without braces)
// appended; its errors are Members'. b is not modified.
func Rewrite(b []byte, drop func(name string) bool, tail string) ([]byte, error) {
	ms, err := Members(b)
	if err != nil {
		return nil, err
	}
	out := make([]byte, 0, len(b)+len(tail)+2)
	out = append(out, '{')
	for _, m := range ms {
		if drop(m.Name) {
			continue
		}
		if len(out) > 1 {
			out = append(out, ',')
		}
		out = append(out, m.RawName...)
		out = append(out, ':')
		out = append(out, m.Raw...)
	}
	if tail != "" {
		if len(out) > 1 {
			out = append(out, ',')
		}
		out = append(out, tail...)
	}
	return append(out, '}'), nil
}
