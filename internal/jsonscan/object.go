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
	var out []Member
	err := eachMember(b, func(name, rawName, raw []byte) {
		out = append(out, Member{Name: string(name), RawName: rawName, Raw: raw})
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// eachMember calls fn with each top-level member of the JSON object b,
// which must be the whole document: its decoded name (valid only during
// the call), and its name and value as written (slices of b). Its errors
// wrap ErrSyntax; fn may have been called before an error is found.
func eachMember(b []byte, fn func(name, rawName, raw []byte)) error {
	var r Reader
	r.Reset(b)
	if r.Peek() != '{' {
		return r.Errorf("want '{'")
	}
	prev := r.Offset() + 1 // just after the '{'
	err := r.ObjectBytes(func(name []byte) error {
		// b[prev:valStart-1] is [ws][,][ws]"name"[ws]; the ':' is at valStart-1.
		valStart := r.Offset()
		if err := r.Skip(); err != nil {
			return err
		}
		head := bytes.TrimSpace(b[prev : valStart-1])
		head = bytes.TrimSpace(bytes.TrimPrefix(head, []byte(",")))
		fn(name, head, bytes.TrimSpace(b[valStart:r.Offset()]))
		prev = r.Offset()
		return nil
	})
	if err != nil {
		return err
	}
	if !r.End() {
		return r.Errorf("data after the object")
	}
	return nil
}

// Rewrite returns the object b without the members whose decoded name
// drop reports (a repeated one everywhere; the name is valid only during
// the call), with tail (members in JSON, without braces) appended; its
// errors are Members'. b is not modified. It allocates the result alone,
// at most len(b)+len(tail)+2 bytes, whatever the members.
func Rewrite(b []byte, drop func(name []byte) bool, tail string) ([]byte, error) {
	out := make([]byte, 0, len(b)+len(tail)+2)
	out = append(out, '{')
	err := eachMember(b, func(name, rawName, raw []byte) {
		if drop(name) {
			return
		}
		if len(out) > 1 {
			out = append(out, ',')
		}
		out = append(out, rawName...)
		out = append(out, ':')
		out = append(out, raw...)
	})
	if err != nil {
		return nil, err
	}
	if tail != "" {
		if len(out) > 1 {
			out = append(out, ',')
		}
		out = append(out, tail...)
	}
	return append(out, '}'), nil
}
