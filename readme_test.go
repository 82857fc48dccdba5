package gateway

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"unicode"
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
		if !ok {
			t.Fatalf("%s has no %q", src.file, src.fn)
		}
		for _, p := range paths {
			if !strings.Contains(head, "\t"+p+"\n") {
				t.Errorf("%s does not import %s, which the README's quick start imports", src.file, p)
			}
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

// TestDocsLinks: every relative link in README.md and docs/ names a file
// that exists, and every #anchor a heading of its page (GitHub's slugs:
// lowercase, punctuation and symbols dropped, spaces to '-', a repeated
// heading's slug suffixed -1, -2, ...), so that the docs' cross
// references keep working as pages are split and headings renamed.
func TestDocsLinks(t *testing.T) {
	pages, err := filepath.Glob("docs/*.md")
	if err != nil {
		t.Fatal(err)
	}
	more, _ := filepath.Glob("docs/*/*.md")
	pages = append(append([]string{"README.md"}, pages...), more...)
	link := regexp.MustCompile(`\]\(([^)\s]+)\)`)
	links := 0
	anchors := map[string][]string{} // a linked page's slugs, read once
	for _, page := range pages {
		b, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		for _, m := range link.FindAllStringSubmatch(outsideFences(string(b)), -1) {
			target := m[1]
			if strings.Contains(target, "://") || strings.HasPrefix(target, "mailto:") {
				continue
			}
			links++
			file, anchor, _ := strings.Cut(target, "#")
			path := page
			if file != "" {
				path = filepath.Join(filepath.Dir(page), file)
				if _, err := os.Stat(path); err != nil {
					t.Errorf("%s: link %q: %v", page, target, err)
					continue
				}
			}
			if anchor == "" || !strings.HasSuffix(path, ".md") {
				continue
			}
			if _, ok := anchors[path]; !ok {
				doc, err := os.ReadFile(path)
				if err != nil {
					t.Fatal(err)
				}
				anchors[path] = slugs(string(doc))
			}
			if !slices.Contains(anchors[path], anchor) {
				t.Errorf("%s: link %q: %s has no heading with the anchor #%s", page, target, path, anchor)
			}
		}
	}
	if links < 50 {
		t.Fatalf("only %d relative links found in %d pages: the pattern is broken", links, len(pages))
	}
	t.Logf("%d relative links in %d pages", links, len(pages))
}

// outsideFences returns md with the lines inside ``` fences blanked.
func outsideFences(md string) string {
	lines := strings.Split(md, "\n")
	in := false
	for i, l := range lines {
		if strings.HasPrefix(strings.TrimSpace(l), "```") {
			in = !in
			lines[i] = ""
		} else if in {
			lines[i] = ""
		}
	}
	return strings.Join(lines, "\n")
}

// slugs returns the anchors GitHub gives the headings of md.
func slugs(md string) []string {
	var out []string
	seen := map[string]int{}
	for _, l := range strings.Split(outsideFences(md), "\n") {
		h := strings.TrimLeft(l, "#")
		if len(h) == len(l) || len(l)-len(h) > 6 || !strings.HasPrefix(h, " ") {
			continue
		}
		var b strings.Builder
		for _, r := range strings.ToLower(strings.TrimSpace(h)) {
			switch {
			case r == ' ':
				b.WriteByte('-')
			case r == '-' || r == '_' || unicode.IsLetter(r) || unicode.IsDigit(r):
				b.WriteRune(r)
			}
		}
		s := b.String()
		if n := seen[s]; n > 0 {
			out = append(out, s+"-"+strconv.Itoa(n))
		} else {
			out = append(out, s)
		}
		seen[s]++
	}
	return out
}
