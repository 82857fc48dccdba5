package sim

import (
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestExportedFieldsDocumented: every exported field of an exported struct
// in sim and reference has a doc comment of its own (one name per field,
// so no field shares another's comment).
func TestExportedFieldsDocumented(t *testing.T) {
	for _, dir := range []string{".", "../reference"} {
		files, err := filepath.Glob(filepath.Join(dir, "*.go"))
		require.NoError(t, err)
		fset := token.NewFileSet()
		for _, f := range files {
			if strings.HasSuffix(f, "_test.go") {
				continue
			}
			src, err := os.ReadFile(f)
			require.NoError(t, err)
			file, err := parser.ParseFile(fset, f, src, parser.ParseComments)
			require.NoError(t, err)
			ast.Inspect(file, func(n ast.Node) bool {
				ts, ok := n.(*ast.TypeSpec)
				if !ok || !ts.Name.IsExported() {
					return true
				}
				st, ok := ts.Type.(*ast.StructType)
				if !ok {
					return true
				}
				for _, fld := range st.Fields.List {
					for _, name := range fld.Names {
						if !name.IsExported() {
							continue
						}
						where := fset.Position(name.Pos()).String() + " " + ts.Name.Name + "." + name.Name
						assert.Len(t, fld.Names, 1, "%s shares its declaration", where)
						if assert.NotNil(t, fld.Doc, "%s has no doc comment", where) {
							doc := fld.Doc.Text()
							assert.True(t, strings.HasPrefix(doc, name.Name+" ") || strings.HasPrefix(doc, name.Name+","),
								"%s: doc should start with its name", where)
						}
					}
				}
				return true
			})
		}
	}
}

// TestPackageDocNamesDefaultPolicies: the package doc's list of the
// default policies names every one DefaultPolicies returns.
func TestPackageDocNamesDefaultPolicies(t *testing.T) {
	file, err := parser.ParseFile(token.NewFileSet(), "doc.go", nil, parser.ParseComments|parser.PackageClauseOnly)
	require.NoError(t, err)
	doc := file.Doc.Text()
	for _, p := range DefaultPolicies() {
		assert.Regexp(t, `\b`+p.Name+`\b`, doc, "the package doc does not name %s", p.Name)
	}
}
