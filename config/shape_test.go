package config

import (
	"reflect"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

// Every JSON field of File, Model and Replica is known to fileShape, so a
// file that sets it loads (kv_events_replay once did not).
func TestShapeKnowsEveryField(t *testing.T) {
	model := fileShape.fields["models"].values
	for _, tc := range []struct {
		name string
		typ  reflect.Type
		s    *shape
	}{
		{"File", reflect.TypeFor[File](), fileShape},
		{"Model", reflect.TypeFor[Model](), model},
		{"Replica", reflect.TypeFor[Replica](), model.fields["replicas"].elems},
		{"pool member", reflect.TypeFor[Replica](), model.fields["pools"].values.elems},
	} {
		for i := range tc.typ.NumField() {
			f := tc.typ.Field(i)
			name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
			if !f.IsExported() || name == "-" || name == "" {
				continue
			}
			assert.Contains(t, tc.s.fields, name, "%s field %s", tc.name, f.Name)
		}
	}
}

// TestDecodeWrongScalarNamesPath: a scalar of the wrong kind or out of
// its field's range makes the file corrupt, and, as for every other
// corrupt value, the error names the value by its full path (model key
// and list index included) and shows it, so that one replica among many
// can be found.
func TestDecodeWrongScalarNamesPath(t *testing.T) {
	for _, tc := range []struct{ doc, path, value string }{
		{`{"models":{"A":{},"JPCP":{"replicas":[{"name":"r0","address":"h:1"},{"name":"r1","address":"h:2","cache_blocks":"8"}]}}}`,
			"models.JPCP.replicas[1].cache_blocks", `"8"`},
		{`{"models":{"JPCP":{"slo_latency_ms":1.5}}}`, "models.JPCP.slo_latency_ms", "1.5"},
		{`{"models":{"JPCP":{"pd_min_uncached_tokens":99999999999999999999}}}`, "models.JPCP.pd_min_uncached_tokens", "99999999999999999999"},
		{`{"models":{"JPCP":{"disaggregate":"yes"}}}`, "models.JPCP.disaggregate", `"yes"`},
		{`{"models":{"JPCP":{"pools":{"p":[{"name":"p0","address":"h:1"},{"name":7,"address":"h:2"}]}}}}`, "models.JPCP.pools.p[1].name", "7"},
		{`{"models":{"JPCP":{"load_weights":{"queue":1e999}}}}`, "models.JPCP.load_weights.queue", "1e999"},
		{`{"models":{"JPCP":{"adapters":["a","b",true]}}}`, "models.JPCP.adapters[2]", "true"},
		{`{"version":"1"}`, "version", `"1"`},
	} {
		_, err := Decode("routing.json", []byte(tc.doc))
		if !assert.ErrorIs(t, err, ErrCorrupt, tc.doc) {
			continue
		}
		assert.Contains(t, err.Error(), "routing.json")
		assert.Contains(t, err.Error(), tc.path+" is ")
		assert.Contains(t, err.Error(), tc.value)
	}
}
