package fleet

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/examlops/gateway/internal/budget"
)

// The scrapes read a few families of a /metrics page; the parser builds
// every family of what it is given, up to 16 times the page's size in
// heap (a page of many short series). So a page is filtered as it
// streams: only the lines of the families read reach the parser, at most
// maxKeptBytes of them a page, and all the pages being parsed at once
// keep at most the Fleet's scrape budget (scrapeBudgetBytes) together.
const (
	// maxKeptBytes bounds the lines a page keeps: an engine's families
	// take a few KiB, a peer's about 90 bytes a replica (11,000 replicas).
	maxKeptBytes = 1 << 20
	// scrapeBudgetBytes bounds the lines kept by all the scrapes of a
	// process at once, engines' and peers' together.
	scrapeBudgetBytes = 16 << 20
	// listBudgetBytes bounds the engines' GET /v1/models bodies being
	// read and parsed at once (each at most maxModelsBytes).
	listBudgetBytes = 16 << 20
	// filterChunk is the most of a line the filter looks at to decide.
	filterChunk = 4 << 10
)

// errPageSeries is the error of a page whose kept lines pass
// maxKeptBytes; errScrapeBudget of one the process's scrape budget cannot
// hold.
var (
	errPageSeries   = fmt.Errorf("the page's series read by the gateway pass %d bytes", maxKeptBytes)
	errScrapeBudget = errors.New("the scrape budget is spent: other pages being read hold it")
)

// familySet names the metric families a scrape reads. A sample of a
// histogram or summary family is kept with its family (its name with
// _bucket, _sum, _count and so on), and a family whose name has such a
// suffix keeps the lines of the name without it too, since the parser
// may read it as that family's sample.
type familySet map[string]bool

// sampleSuffixes are the suffixes the text format gives the samples of a
// histogram or summary family.
var sampleSuffixes = []string{"_bucket", "_sum", "_count", "_total", "_created", "_gcount", "_gsum"}

// newFamilySet returns the set of names, with their related names (see
// familySet).
func newFamilySet(names ...string) familySet {
	s := familySet{}
	add := func(n string) {
		s[n] = true
		for _, x := range sampleSuffixes {
			s[n+x] = true
		}
	}
	for _, n := range names {
		add(n)
		for _, x := range sampleSuffixes {
			if base, ok := bytes.CutSuffix([]byte(n), []byte(x)); ok && len(base) > 0 {
				add(string(base))
			}
		}
	}
	return s
}

// isNameByte reports whether c may continue a metric name in the text
// format (the parser's legacy names: letters, digits, _ and :).
func isNameByte(c byte) bool {
	return c == '_' || c == ':' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')
}

// keepLine reports whether a line of a page, given by its first bytes
// (all of it, or the first filterChunk bytes, whole reporting whether the
// chunk is the whole line), is kept: a sample of a named family, or its
// HELP or TYPE comment. Lines it cannot tell (a name in quotes, a name
// longer than the chunk) are kept; blank lines and other comments are not.
func (s familySet) keepLine(line []byte, whole bool) bool {
	line = trimBlank(line)
	if len(line) == 0 || line[0] == '\n' {
		return false
	}
	switch line[0] {
	case '{', '"':
		return true // a quoted (UTF-8) name
	case '#':
		rest := trimBlank(line[1:])
		k := 0
		for k < len(rest) && rest[k] != ' ' && rest[k] != '\t' && rest[k] != '\n' {
			k++
		}
		if kw := string(rest[:k]); kw != "HELP" && kw != "TYPE" {
			// A comment, which the parser skips, unless the chunk cut
			// HELP or TYPE short.
			return k == len(rest) && !whole && (strings.HasPrefix("HELP", kw) || strings.HasPrefix("TYPE", kw))
		}
		line = trimBlank(rest[k:])
		if len(line) == 0 {
			return !whole
		}
		if line[0] == '"' {
			return true
		}
	}
	n := 0
	for n < len(line) && isNameByte(line[n]) {
		n++
	}
	if n == len(line) && !whole {
		return true // the name may go on past the chunk
	}
	return s[string(line[:n])]
}

// trimBlank returns b without its leading blanks and tabs.
func trimBlank(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t') {
		b = b[1:]
	}
	return b
}

// familyFilter is a page restricted to the lines of a familySet; see
// filterFamilies.
type familyFilter struct {
	r    *bufio.Reader
	set  familySet
	hold *budget.Hold
	// out is what is left to hand out of the kept chunk last read; keep
	// and drop say what to do with the rest of a line cut at a chunk.
	out        []byte
	keep, drop bool
	kept       int64
	err        error
}

// filterFamilies returns r restricted to the lines set keeps
// (familySet.keepLine). The kept lines are charged to hold as they are
// read; once they pass maxKeptBytes, or hold cannot grow, Read fails
// with errPageSeries or errScrapeBudget. The caller releases hold.
func filterFamilies(r io.Reader, set familySet, hold *budget.Hold) io.Reader {
	return &familyFilter{r: bufio.NewReaderSize(r, filterChunk), set: set, hold: hold}
}

func (f *familyFilter) Read(p []byte) (int, error) {
	for len(f.out) == 0 {
		if f.err != nil {
			return 0, f.err
		}
		chunk, err := f.r.ReadSlice('\n')
		cut := errors.Is(err, bufio.ErrBufferFull)
		if err != nil && !cut {
			f.err = err
		}
		if len(chunk) == 0 {
			continue
		}
		switch {
		case f.drop:
		case f.keep || f.set.keepLine(chunk, !cut):
			if f.kept += int64(len(chunk)); f.kept > maxKeptBytes {
				f.err, f.out = errPageSeries, nil
				continue
			}
			if !f.hold.Grow(f.kept) {
				f.err, f.out = errScrapeBudget, nil
				continue
			}
			f.out, f.keep = chunk, cut
			continue
		default:
			f.drop = cut
			continue
		}
		f.drop = cut // the rest of a dropped line
	}
	n := copy(p, f.out)
	f.out = f.out[n:]
	return n, nil
}
