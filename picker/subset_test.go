package picker

import (
	"errors"
	"slices"
	"strings"
	"testing"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/structpb"
)

func TestParseSubsetHint(t *testing.T) {
	for _, tc := range []struct {
		name    string
		md      *corev3.Metadata
		want    []string
		present bool
		errHas  string
	}{
		{name: "nil metadata"},
		{name: "other namespace", md: &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{"envoy.lb": {}}}},
		{name: "namespace without key", md: &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{SubsetNamespace: {}}}},
		{name: "null", md: subsetMD(t, nil)},
		{name: "list", md: subsetMD(t, []any{"10.0.0.1:80", " 10.0.0.2:81 "}), want: []string{"10.0.0.1:80", "10.0.0.2:81"}, present: true},
		{name: "comma string", md: subsetMD(t, "10.0.0.1:80,10.0.0.2:81,,"), want: []string{"10.0.0.1:80", "10.0.0.2:81"}, present: true},
		{name: "ipv6 and bare ip", md: subsetMD(t, []any{"[::1]:8000", "fd00::1", "10.0.0.3"}), want: []string{"[::1]:8000", "fd00::1", "10.0.0.3"}, present: true},
		{name: "canonical form", md: subsetMD(t, "[0:0::1]:8000"), want: []string{"[::1]:8000"}, present: true},
		{name: "skips bad entries", md: subsetMD(t, []any{true, "x:1", "10.0.0.1:80"}), want: []string{"10.0.0.1:80"}, present: true},
		{name: "empty list", md: subsetMD(t, []any{}), present: true, errHas: "is empty"},
		{name: "empty string", md: subsetMD(t, ""), present: true, errHas: "is empty"},
		{name: "all bad", md: subsetMD(t, []any{"host:80", 3.0}), present: true, errHas: `first bad entry: "host:80"`},
		{name: "non-string element first", md: subsetMD(t, []any{3.0}), present: true, errHas: "element 0, a number"},
		{name: "number", md: subsetMD(t, 1.0), present: true, errHas: "is a number"},
		{name: "bool", md: subsetMD(t, true), present: true, errHas: "is a bool"},
		{name: "struct", md: subsetMD(t, map[string]any{}), present: true, errHas: "is a struct"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s, present, err := parseSubsetHint(tc.md, nil)
			if present != tc.present {
				t.Errorf("present %v, want %v", present, tc.present)
			}
			if tc.errHas != "" {
				if !errors.Is(err, ErrNoEndpoint) || !strings.Contains(err.Error(), tc.errHas) || !strings.Contains(err.Error(), SubsetKey) {
					t.Fatalf("error %v, want ErrNoEndpoint naming %s and %q", err, SubsetKey, tc.errHas)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !slices.Equal(s, tc.want) {
				t.Errorf("subset %q, want %q", s, tc.want)
			}
		})
	}
}

func TestSubsetAllows(t *testing.T) {
	s := Subset{"10.0.0.1:80", "10.0.0.2", "[::1]:8000"}
	for _, tc := range []struct {
		ep   string
		want bool
	}{
		{"10.0.0.1:80", true},
		{"10.0.0.1:81", false},
		{"10.0.0.2:1", true},
		{"10.0.0.2:65535", true},
		{"[::1]:8000", true},
		{"[0::1]:8000", true},
		{"[::1]:8001", false},
		{"10.0.0.3:80", false},
		{"localhost:80", false},
		{"", false},
	} {
		if got := s.Allows(tc.ep); got != tc.want {
			t.Errorf("Allows(%q) = %v, want %v", tc.ep, got, tc.want)
		}
	}
	if !Subset(nil).Allows("anything") {
		t.Error("a nil Subset must allow everything")
	}
	if (Subset{}).Allows("10.0.0.1:80") {
		t.Error("an empty Subset must allow nothing")
	}
}

func TestServedEndpoint(t *testing.T) {
	if got := servedEndpoint(servedMD(t, "10.0.0.1:80")); got != "10.0.0.1:80" {
		t.Errorf("served %q", got)
	}
	s, _ := structpb.NewStruct(map[string]any{ServedKey: []any{"10.0.0.2:80", "10.0.0.3:80"}})
	md := &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{DestinationNamespace: s}}
	if got := servedEndpoint(md); got != "10.0.0.2:80" {
		t.Errorf("served from a list %q", got)
	}
	if got := servedEndpoint(nil); got != "" {
		t.Errorf("served from nothing %q", got)
	}
}

// FuzzSubsetHint parses the filter metadata of a ProcessingRequest from
// arbitrary protobuf bytes, as they would arrive from the data plane. A hint
// is absent (nil, no error), refused (ErrNoEndpoint naming the key), or a
// non-empty list of canonical entries each of which allows itself.
func FuzzSubsetHint(f *testing.F) {
	for _, v := range []any{
		[]any{"10.0.0.1:80", "10.0.0.2:81"}, "10.0.0.1:80, [::1]:9", "", []any{}, 4.0, nil,
		[]any{true, "fd00::2", "10.0.0.3:1,10.0.0.4:2"}, map[string]any{"x": "y"},
	} {
		b, err := proto.Marshal(subsetMD(f, v))
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b)
	}
	b, _ := proto.Marshal(servedMD(f, "10.0.0.1:80"))
	f.Add(b)
	f.Fuzz(func(t *testing.T, data []byte) {
		md := &corev3.Metadata{}
		if proto.Unmarshal(data, md) != nil {
			return
		}
		_ = servedEndpoint(md)
		s, present, err := parseSubsetHint(md, nil)
		switch {
		case !present:
			if s != nil || err != nil {
				t.Fatalf("absent hint gave %q, %v", s, err)
			}
		case err != nil:
			if !errors.Is(err, ErrNoEndpoint) || !strings.Contains(err.Error(), SubsetKey) {
				t.Fatalf("error %v does not wrap ErrNoEndpoint naming the key", err)
			}
		default:
			if len(s) == 0 {
				t.Fatal("a present hint without error allows nothing")
			}
			for _, e := range s {
				n, ok := normalizeEntry(e)
				if !ok || n != e {
					t.Fatalf("entry %q is not canonical (%q, %v)", e, n, ok)
				}
				if strings.Contains(e, "]:") || strings.Count(e, ":") == 1 {
					if !s.Allows(e) {
						t.Fatalf("subset %q does not allow its own entry %q", s, e)
					}
				}
			}
		}
	})
}

// FuzzSubsetString parses a comma-separated hint: the entries are exactly
// the valid, trimmed, non-empty pieces, in order.
func FuzzSubsetString(f *testing.F) {
	for _, s := range []string{"10.0.0.1:80", "10.0.0.1:80,10.0.0.2:81", " , ", "[::1]:1,fd00::1", "a,b:1,10.0.0.1:1", "10.0.0.1:99999"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, str string) {
		md := &corev3.Metadata{FilterMetadata: map[string]*structpb.Struct{SubsetNamespace: {
			Fields: map[string]*structpb.Value{SubsetKey: structpb.NewStringValue(str)}}}}
		got, present, err := parseSubsetHint(md, nil)
		if !present {
			t.Fatal("a string hint must be present")
		}
		var want []string
		for _, p := range strings.Split(str, ",") {
			if n, ok := normalizeEntry(strings.TrimSpace(p)); ok {
				want = append(want, n)
			}
		}
		if len(want) == 0 {
			if !errors.Is(err, ErrNoEndpoint) {
				t.Fatalf("%q: no valid entry, error %v", str, err)
			}
			return
		}
		if err != nil || !slices.Equal(got, want) {
			t.Fatalf("%q: got %q, %v; want %q", str, got, err, want)
		}
	})
}
