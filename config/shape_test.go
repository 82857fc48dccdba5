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
