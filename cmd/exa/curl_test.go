package main

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// Every curl example that posts a JSON body (README, docs, `exa serve
// gateway --help`) declares it: vLLM's server answers 400 to a body
// without Content-Type: application/json.
func TestCurlExamplesSendContentType(t *testing.T) {
	texts := map[string]string{"exa serve gateway --help": newGatewayCmd().Example}
	docs, err := filepath.Glob(filepath.Join("..", "..", "docs", "*.md"))
	require.NoError(t, err)
	for _, p := range append(docs, filepath.Join("..", "..", "README.md")) {
		b, err := os.ReadFile(p)
		require.NoError(t, err)
		texts[p] = string(b)
	}
	checked := 0
	for where, text := range texts {
		// A command continued with "\" is joined into one line.
		lines := strings.Split(strings.ReplaceAll(text, "\\\n", " "), "\n")
		for _, l := range lines {
			if !strings.Contains(l, "curl ") || !strings.Contains(l, " -d ") {
				continue
			}
			checked++
			assert.Contains(t, l, "Content-Type: application/json", "%s: %s", where, strings.TrimSpace(l))
		}
	}
	assert.GreaterOrEqual(t, checked, 3, "the README's, docs/lora.md's and the help's examples")
}
