package gateway

import (
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// metricDef matches the ways the sources name an exa_gateway_ metric:
// Opts with Namespace ns ("exa_gateway"), a full name, ns+"_name", and
// the exact index's kvDesc.
var metricDef = regexp.MustCompile(`Namespace: ns, Name: "([a-z_]+)"|"exa_gateway_([a-z_]+)"|ns\+"_([a-z_]+)"|kvDesc\("([a-z_]+)"`)

// TestMetricsDocumented: every exa_gateway_ metric the gateway and the
// picker define is in docs/metrics.md, whose list claims to be all of
// them, and every exa_picker_ metric is in docs/picker.md.
func TestMetricsDocumented(t *testing.T) {
	docs := map[string]string{}
	for _, page := range []string{"docs/metrics.md", "docs/picker.md", "docs/kubernetes.md"} {
		b, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		docs[page] = string(b)
	}
	picker := regexp.MustCompile(`"(exa_picker_[a-z_]+)"`)
	found := 0
	err := filepath.WalkDir(".", func(path string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() && (strings.HasPrefix(d.Name(), ".") || d.Name() == "testdata") && path != "." {
			return filepath.SkipDir
		}
		if d.IsDir() || !strings.HasSuffix(path, ".go") || strings.HasSuffix(path, "_test.go") {
			return nil
		}
		b, err := os.ReadFile(path)
		if err != nil {
			return err
		}
		for _, m := range metricDef.FindAllStringSubmatch(string(b), -1) {
			name := m[1] + m[2] + m[3] + m[4]
			found++
			if !regexp.MustCompile(`(^|[^a-z_])` + name + `([^a-z_]|$)`).MatchString(docs["docs/metrics.md"]) {
				t.Errorf("%s defines exa_gateway_%s, which docs/metrics.md does not list", path, name)
			}
		}
		for _, m := range picker.FindAllStringSubmatch(string(b), -1) {
			if !strings.Contains(docs["docs/picker.md"], m[1]) && !strings.Contains(docs["docs/kubernetes.md"], m[1]) {
				t.Errorf("%s defines %s, which neither docs/picker.md nor docs/kubernetes.md names", path, m[1])
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if found < 50 {
		t.Fatalf("only %d metric definitions found: the pattern is broken", found)
	}
}

// TestReadmeIndexesDocs: README.md, the docs' index (its Layout table),
// links every page under docs/, so that no page is reachable only by
// chance from another.
func TestReadmeIndexesDocs(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	pages, _ := filepath.Glob("docs/*.md")
	more, _ := filepath.Glob("docs/*/README.md")
	pages = append(pages, more...)
	if len(pages) < 10 {
		t.Fatalf("only %d pages under docs/", len(pages))
	}
	text := outsideFences(string(readme))
	for _, p := range pages {
		if !strings.Contains(text, "]("+filepath.ToSlash(p)+")") && !strings.Contains(text, "]("+filepath.ToSlash(p)+"#") {
			t.Errorf("README.md does not link %s", p)
		}
	}
}

// TestReadmeLayout: the README's Layout table names every top-level
// directory and every package under internal/.
func TestReadmeLayout(t *testing.T) {
	readme, err := os.ReadFile("README.md")
	if err != nil {
		t.Fatal(err)
	}
	_, layout, ok := strings.Cut(string(readme), "\n## Layout\n")
	if !ok {
		t.Fatal("README.md has no ## Layout")
	}
	layout, _, _ = strings.Cut(layout, "\n## ")
	top, _ := filepath.Glob("*")
	internal, _ := filepath.Glob("internal/*")
	for _, dir := range append(top, internal...) {
		if fi, err := os.Stat(dir); err != nil || !fi.IsDir() || dir == ".git" || filepath.Base(dir) == "testdata" {
			continue // testdata/: fuzzing's, gitignored
		}
		want := "`" + dir + "/" // a top-level directory: `sim/`, `cmd/exa/`, `.ci/run`
		if strings.HasPrefix(dir, "internal"+string(filepath.Separator)) {
			want = "`" + filepath.Base(dir) + "`"
		}
		if !strings.Contains(layout, want) {
			t.Errorf("README.md's Layout does not name %s", dir)
		}
	}
}

// TestDocsNoProseFences: no list item of the docs continues inside an
// unindented ``` fence without a language, which GitHub shows as a code
// block that ends the list (the
// way docs/gateway.md's Endpoints and Prefix key lists once rendered:
// each item's text after its first lines in monospace, links dead).
func TestDocsNoProseFences(t *testing.T) {
	pages, _ := filepath.Glob("docs/*.md")
	item := regexp.MustCompile(`^\s*(-|\*|\d+\.)\s|^\s{2,}\S`)
	for _, page := range append([]string{"README.md"}, pages...) {
		b, err := os.ReadFile(page)
		if err != nil {
			t.Fatal(err)
		}
		lines := strings.Split(string(b), "\n")
		in, prev := false, ""
		for i, l := range lines {
			if strings.HasPrefix(strings.TrimSpace(l), "```") {
				if !in && l == "```" && item.MatchString(prev) {
					t.Errorf("%s:%d: a list item continues in a code fence: %q", page, i+1, prev)
				}
				in = !in
			}
			if strings.TrimSpace(l) != "" && !in {
				prev = l
			}
		}
	}
}
