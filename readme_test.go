package gateway

import (
	"os"
	"regexp"
	"strings"
	"testing"
)

// TestReadmeQuickStart: every code line of the README's quick start
// appears, in order, in Example (example_test.go) and in the quickstart
// command (examples/quickstart), comments and spacing aside, so the
// snippet a newcomer copies is code that compiles and runs.
func TestReadmeQuickStart(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile("(?s)## Quick start \\(library\\)\n+```go\n(.*?)```").FindSubmatch(readme)
	if m == nil {
		t.Fatal("README.md has no Go block under \"## Quick start (library)\"")
	}
	// The snippet's import block: each path must be imported by both
	// sources too, so that the snippet with its imports compiles.
	imports := regexp.MustCompile("(?s)^import \\((.*?)\n\\)\n").FindSubmatch(m[1])
	if imports == nil {
		t.Fatal("the quick start does not open with an import ( ... ) block")
	}
	paths := strings.Fields(string(imports[1]))
	var want []string
	for _, l := range strings.Split(string(m[1][len(imports[0]):]), "\n") {
		if l = codeOf(l); l != "" {
			want = append(want, l)
		}
	}
	if len(want) < 10 {
		t.Fatalf("only %d code lines in the quick start: %q", len(want), want)
	}
	for _, src := range []struct{ file, fn string }{
		{"example_test.go", "func Example() {"},
		{"examples/quickstart/main.go", "func main() {"},
	} {
		b, err := os.ReadFile(src.file)
		if err != nil {
			t.Fatal(err)
		}
		head, body, ok := strings.Cut(string(b), src.fn)
		for _, p := range paths {
			if !strings.Contains(head, "\t"+p+"\n") {
				t.Errorf("%s does not import %s, which the README's quick start imports", src.file, p)
			}
		}
		if !ok {
			t.Fatalf("%s has no %q", src.file, src.fn)
		}
		body, _, _ = strings.Cut(body, "\n}\n")
		var got []string
		for _, l := range strings.Split(body, "\n") {
			if l = codeOf(l); l != "" {
				got = append(got, l)
			}
		}
		i := 0
		for _, l := range got {
			if i < len(want) && l == want[i] {
				i++
			}
		}
		if i < len(want) {
			t.Errorf("%s: %s lacks the README's line %q (or has it out of order)", src.file, src.fn, want[i])
		}
	}
}

// codeOf returns a line's code: its trailing comment cut, its spaces
// collapsed, "" for a comment line.
func codeOf(l string) string {
	if i := strings.Index(l, "// "); i >= 0 {
		l = l[:i]
	}
	return strings.Join(strings.Fields(l), " ")
}
