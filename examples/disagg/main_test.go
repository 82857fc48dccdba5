package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestRun: every planned request splits (its prompt is uncached on the
// decode pool) and the split output equals the co-located one.
func TestRun(t *testing.T) {
	f, err := os.Create(filepath.Join(t.TempDir(), "out"))
	if err != nil {
		t.Fatal(err)
	}
	if err := run(f); err != nil {
		t.Fatal(err)
	}
	b, err := os.ReadFile(f.Name())
	if err != nil {
		t.Fatal(err)
	}
	out := string(b)
	if strings.Count(out, "split true") != 2 || strings.Count(out, "identical output: true") != 2 {
		t.Fatalf("want two split requests with identical output, got:\n%s", out)
	}
}
