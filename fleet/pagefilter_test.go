package fleet

import (
	"bytes"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

	"github.com/examlops/gateway/config"
	"github.com/examlops/gateway/internal/budget"
)

func filtered(t testing.TB, page string, names ...string) (string, error) {
	t.Helper()
	h := budget.Hold{B: budget.New(scrapeBudgetBytes)}
	defer h.Release()
	b, err := io.ReadAll(filterFamilies(strings.NewReader(page), newFamilySet(names...), &h))
	return string(b), err
}

func TestFilterFamilies(t *testing.T) {
	long := strings.Repeat("x", 3*filterChunk)
	for _, tc := range []struct {
		name, page, want string
	}{
		{"samples of the family", "a 1\nb 2\na{l=\"v\"} 3\n", "a 1\na{l=\"v\"} 3\n"},
		{"its HELP and TYPE", "# HELP a doc\n# TYPE a gauge\n# HELP b doc\n# TYPE b gauge\na 1\nb 2\n", "# HELP a doc\n# TYPE a gauge\na 1\n"},
		{"other comments and blank lines dropped", "# a comment\n\n  \na 1\n#\n", "a 1\n"},
		{"leading blanks", " \ta 1\n \tb 2\n", " \ta 1\n"},
		{"a longer name is another family", "ab 1\na_b 2\na:b 3\na 4\n", "a 4\n"},
		{"histogram samples with their family", "# TYPE a histogram\na_bucket{le=\"1\"} 1\na_sum 1\na_count 1\nb_count 1\n", "# TYPE a histogram\na_bucket{le=\"1\"} 1\na_sum 1\na_count 1\n"},
		{"quoted names, read as the parser reads them", "{\"a\"} 1\n# HELP \"a\" doc\n{\"b.c\"} 2\n{l=\"v\", \"a\"} 3\n{l=\"a\"} 4\n\"a\" 5\n\"b\" 6\n", "{\"a\"} 1\n# HELP \"a\" doc\n{l=\"v\", \"a\"} 3\n\"a\" 5\n"},
		{"a name with a quoted part", "a_\"b\" 1\n# TYPE a_\"b\" gauge\na_b 2\n", ""},
		{"a label naming the family is not its name", "{l=\"a\", \"b\"} 1\n", ""},
		{"blanks past a chunk before the name", strings.Repeat(" ", 5000) + "a 5\n" + strings.Repeat("\t", 5000) + "b 6\n", strings.Repeat(" ", 5000-filterChunk) + "a 5\n"},
		{"a sample of another family read by name", "q_sum 1\n# TYPE \"q\" summary\n{\"q_sum\",quantile=\"x\"} 1\na 1\n", "a 1\n"},
		{"the last line without a newline", "b 1\na 2", "a 2"},
		{"a long line of another family dropped whole", "b{l=\"" + long + "\"} 1\na 1\n", "a 1\n"},
		{"a long line of the family kept whole", "a{l=\"" + long + "\"} 1\nb 1\n", "a{l=\"" + long + "\"} 1\n"},
		{"a name longer than a chunk is none of the set", long + " 1\nb 1\n", ""},
		{"a long comment dropped", "# " + long + "\na 1\n", "a 1\n"},
		{"a long HELP kept", "# HELP a " + long + "\na 1\n", "# HELP a " + long + "\na 1\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := filtered(t, tc.page, "a")
			require.NoError(t, err)
			if got != tc.want {
				t.Fatalf("got %.120q (%d bytes), want %.120q (%d bytes)", got, len(got), tc.want, len(tc.want))
			}
		})
	}
	// A family named with a sample suffix keeps its base's lines: the
	// parser reads a_count as a sample of a summary a.
	got, err := filtered(t, "# TYPE a summary\na_count 1\na_sum 2\nb 1\n", "a_count")
	require.NoError(t, err)
	assert.Equal(t, "# TYPE a summary\na_count 1\na_sum 2\n", got)
}

// A page keeps at most maxKeptBytes of its families' lines; dropped lines
// cost nothing, however many.
func TestFilterFamiliesPageBound(t *testing.T) {
	line := "a{l=\"0123456789\"} 1\n"
	var b strings.Builder
	for b.Len() <= 2*maxKeptBytes {
		b.WriteString("b" + line) // another family
	}
	_, err := filtered(t, b.String()+"a 1\n", "a")
	require.NoError(t, err, "2 MiB of other families")
	b.Reset()
	for b.Len() <= maxKeptBytes {
		b.WriteString(line)
	}
	_, err = filtered(t, b.String(), "a")
	require.ErrorIs(t, err, errPageSeries)

	// A page past maxMetricsBytes fails, where cutting it would parse
	// what came before the cut as the whole page.
	b.Reset()
	for b.Len() <= maxMetricsBytes {
		b.WriteString("b" + line)
	}
	_, err = filtered(t, b.String()+"a 1\n", "a")
	require.ErrorIs(t, err, errPageLong)
	_, err = filtered(t, b.String()[:maxMetricsBytes-100]+"\na 1\n", "a")
	require.NoError(t, err, "up to maxMetricsBytes")
}

// All the pages being read share one budget: a page the budget cannot
// hold fails, and a page's share returns to the budget when released.
func TestFilterFamiliesBudget(t *testing.T) {
	line := "a{l=\"0123456789\"} 1\n"
	page := strings.Repeat(line, 100)
	b := budget.New(int64(len(page)) + int64(len(line))/2)
	h1 := budget.Hold{B: b}
	_, err := io.ReadAll(filterFamilies(strings.NewReader(page), newFamilySet("a"), &h1))
	require.NoError(t, err)
	assert.Equal(t, int64(len(page)), b.Used())
	h2 := budget.Hold{B: b}
	_, err = io.ReadAll(filterFamilies(strings.NewReader(page), newFamilySet("a"), &h2))
	require.ErrorIs(t, err, errScrapeBudget)
	assert.Equal(t, int64(len(page)), b.Used(), "the refused page holds nothing")
	h1.Release()
	h2.Release()
	_, err = io.ReadAll(filterFamilies(strings.NewReader(page), newFamilySet("a"), &h2))
	require.NoError(t, err)
	h2.Release()
	assert.Zero(t, b.Used())
}

func parsePage(b []byte) (map[string]*dto.MetricFamily, error) {
	p := expfmt.NewTextParser(model.UTF8Validation)
	return p.TextToMetricFamilies(bytes.NewReader(b))
}

// The filter is a differential of the parser: wherever the parser reads
// a whole page, it reads the filtered page too, and each family named
// comes out the same.
func FuzzFilterFamilies(f *testing.F) {
	for _, b := range recordedPages(f) {
		f.Add(b, "vllm:num_requests_running")
		f.Add(b, "vllm:lora_requests_info")
	}
	f.Add([]byte("# TYPE a summary\na_count 1\na_sum 2\na{quantile=\"0.5\"} 1\n"), "a_count")
	f.Add([]byte("# TYPE a histogram\na_bucket{le=\"+Inf\"} 1\na_count 1\n# HELP a x\n"), "a")
	f.Add([]byte("{\"a\",l=\"v\"} 1\n# TYPE \"a\" gauge\n"), "a")
	f.Add([]byte("a{l=\"v\"} 1 123\n  a 2\n\ta{l=\"w\"} 3\n"), "a")
	// Found by review: a quoted part in a name, blanks past a chunk, a
	// braced name of another family.
	f.Add([]byte("vllm:num_requests_\"running\" 5\n# TYPE vllm:num_requests_\"running\" gauge\n"), "x")
	f.Add([]byte(strings.Repeat(" ", 5000)+"vllm:num_requests_running 5\n"), "x")
	f.Add([]byte("q_sum 1\n# TYPE \"q\" summary\n{\"q_sum\",quantile=\"x\"} 1\nvllm:num_requests_running 1\n"), "x")
	f.Add([]byte("{l=\"v\",\"vllm:num_requests_running\"} 1\n{\"a\\\"b\"} 2\n"), "a\"b")
	f.Fuzz(func(t *testing.T, page []byte, name string) {
		names := append(strings.Split(name, ","), MetricPendingPrefill, "vllm:num_requests_running")
		full, err := parsePage(page)
		if err != nil {
			return
		}
		h := budget.Hold{B: budget.New(scrapeBudgetBytes)}
		b, err := io.ReadAll(filterFamilies(bytes.NewReader(page), newFamilySet(names...), &h))
		require.NoError(t, err)
		got, err := parsePage(b)
		require.NoError(t, err, "the whole page parses, the filtered one not:\n%q\n%q", page, b)
		for _, n := range names {
			if !proto.Equal(full[n], got[n]) {
				t.Fatalf("family %q: %v against %v\npage %q\nfiltered %q", n, full[n], got[n], page, b)
			}
		}
	})
}

// BenchmarkEnginePage parses a real engine page (llm-d-inference-sim's,
// 17 KB, after one request) as a scrape does, whole (as before the
// filter) and filtered.
func BenchmarkEnginePage(b *testing.B) {
	page, err := os.ReadFile(filepath.Join("testdata", "metrics", "llm-d-inference-sim-v0.10.2-after-one-request.txt"))
	require.NoError(b, err)
	bud := budget.New(scrapeBudgetBytes)
	for _, filter := range []bool{false, true} {
		name := map[bool]string{false: "whole", true: "filtered"}[filter]
		b.Run(name, func(b *testing.B) {
			b.ReportAllocs()
			for b.Loop() {
				var r io.Reader = bytes.NewReader(page)
				h := budget.Hold{B: bud}
				if filter {
					r = filterFamilies(r, defaultFamilies, &h)
				}
				res, err := parseEngineScrapeAs(r, config.EngineAuto, nil)
				h.Release()
				if err != nil || res.engine == "" {
					b.Fatal(err, res.engine)
				}
			}
		})
	}
}
