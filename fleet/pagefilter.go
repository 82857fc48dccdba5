package fleet

import (
	"bufio"
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

// errPageLong is the error of a page past maxMetricsBytes, errPageSeries
// of one whose kept lines pass maxKeptBytes, errScrapeBudget of one the
// process's scrape budget cannot hold.
var (
	errPageLong     = fmt.Errorf("the page passes %d bytes", maxMetricsBytes)
	errPageSeries   = fmt.Errorf("the page's series read by the gateway pass %d bytes", maxKeptBytes)
	errScrapeBudget = errors.New("the scrape budget is spent: other pages being read hold it")
)

// familySet names the metric families a scrape reads. A sample of a
// histogram or summary family is kept with its family (its name with
// _bucket, _sum, _count and so on), and a family whose name has such a
// suffix keeps the lines of the name without it too, since the parser
// may read it as that family's sample.
type familySet struct {
	names map[string]bool
	// maxLen is the longest name's length: a longer name is none of them.
	maxLen int
}

// sampleSuffixes are the suffixes the text format gives the samples of a
// histogram or summary family.
var sampleSuffixes = []string{"_bucket", "_sum", "_count", "_total", "_created", "_gcount", "_gsum"}

// newFamilySet returns the set of names, with their related names (see
// familySet).
func newFamilySet(names ...string) familySet {
	s := familySet{names: map[string]bool{}}
	add := func(n string) {
		for _, x := range append([]string{""}, sampleSuffixes...) {
			s.names[n+x] = true
			s.maxLen = max(s.maxLen, len(n+x))
		}
	}
	for _, n := range names {
		add(n)
		for _, x := range sampleSuffixes {
			if base, ok := strings.CutSuffix(n, x); ok && base != "" {
				add(base)
			}
		}
	}
	return s
}

// has reports whether the set names tok.
func (s familySet) has(tok []byte) bool { return s.names[string(tok)] }

// nameToken reads the metric name (label false) or label name at the
// start of b as the text parser does (prometheus/common v0.73.1,
// readTokenAsMetricName and readTokenAsLabelName): name bytes and quoted
// parts, a quoted part's escapes (\\, \n, \") decoded; the token ends
// at a byte that cannot go on with it (a blank, or = for a label), or just
// after a closing quote. It returns the token, the bytes it took, cut
// when b ended before the token did (and whole, which says b is the
// whole rest of the page's line, is false), and bad when the parser
// fails on it.
func nameToken(b []byte, label, whole bool) (tok []byte, n int, cut, bad bool) {
	if len(b) == 0 || !(b[0] == '"' || plainNameByte[b[0]] && (b[0] < '0' || b[0] > '9') && (!label || b[0] != ':')) {
		return nil, 0, false, false
	}
	// Name bytes up to the end, or to a quote.
	i := 0
	for i < len(b) && plainNameByte[b[i]] && (!label || b[i] != ':') {
		i++
	}
	switch {
	case i == len(b):
		return b, i, !whole, false
	case b[i] != '"':
		return b[:i], i, false, false
	}
	// A quoted part, which any byte continues: its closing quote ends the
	// token.
	q, m, cut, bad := readQuoted(b[i:], true)
	if cut {
		return nil, i + m, !whole, whole // at the page's end the parser fails
	}
	return append(b[:i:i], q...), i + m, false, bad
}

// readQuoted reads the quoted string at the start of b (b[0] is its
// quote) as the text parser does: escapes \\, \" and \n, no raw
// new-line. It returns the string, decoded when decode is set, and the
// bytes it took; cut when b ends before the closing quote, bad when the
// parser fails on it.
func readQuoted(b []byte, decode bool) (q []byte, n int, cut, bad bool) {
	for i := 1; i < len(b); i++ {
		c := b[i]
		switch c {
		case '"':
			return q, i + 1, false, false
		case '\n':
			return q, i, false, true
		case '\\':
			if i++; i == len(b) {
				return q, i, true, false
			}
			switch b[i] {
			case '\\', '"':
				c = b[i]
			case 'n':
				c = '\n'
			default:
				return q, i, false, true
			}
		}
		if decode {
			q = append(q, c)
		}
	}
	return q, len(b), true, false
}

// plainNameByte is true for the bytes a name may hold outside quotes:
// letters, digits, _ and : (not in a label's name).
var plainNameByte = func() (t [256]bool) {
	for c := range 256 {
		t[c] = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == ':'
	}
	return t
}()

// keepLine reports whether a line of a page, given by its first bytes
// (all of it, whole, or the first filterChunk bytes), is kept: a sample
// of a named family, or its HELP or TYPE comment, its name read as the
// parser reads it (nameToken), in braces too. Blank lines and other
// comments are not kept, nor lines the parser fails on. A line whose name
// the chunk cuts is kept while what the chunk shows of it could still be
// a name of the set.
func (s familySet) keepLine(line []byte, whole bool) bool {
	line = trimBlank(line)
	if len(line) == 0 {
		return !whole // blanks up to the chunk's end: cannot tell
	}
	switch line[0] {
	case '\n':
		return false
	case '#':
		rest := trimBlank(line[1:])
		k := 0
		for k < len(rest) && rest[k] != ' ' && rest[k] != '\t' && rest[k] != '\n' {
			k++
		}
		if kw := string(rest[:k]); k == len(rest) {
			// Cut in the keyword: keep what may be HELP or TYPE (a
			// comment is safe to keep).
			return !whole && (strings.HasPrefix("HELP", kw) || strings.HasPrefix("TYPE", kw))
		}
		if kw := string(rest[:k]); kw != "HELP" && kw != "TYPE" {
			return false // a comment the parser skips
		}
		line = trimBlank(rest[k:])
		if len(line) == 0 {
			return !whole
		}
		if line[0] == '\n' {
			return false
		}
	case '{':
		return s.keepBraced(line[1:], whole)
	}
	tok, _, cut, bad := nameToken(line, false, whole)
	switch {
	case bad:
		return false
	case cut:
		return len(tok) <= s.maxLen
	}
	return s.has(tok)
}

// keepBraced is keepLine for a sample whose name is in its braces
// ({"name", label="value"}): b follows the opening brace.
func (s familySet) keepBraced(b []byte, whole bool) bool {
	for {
		if b = trimBlank(b); len(b) == 0 {
			return !whole
		}
		tok, n, cut, bad := nameToken(b, true, whole)
		switch {
		case bad || (len(tok) == 0 && !cut):
			return false // the parser fails here: "}" with no name too
		case cut:
			return true
		}
		if b = trimBlank(b[n:]); len(b) == 0 {
			return !whole
		}
		if b[0] != '=' {
			return s.has(tok) // the name
		}
		// A label's value: a quoted string, then "," or "}".
		if b = trimBlank(b[1:]); len(b) == 0 {
			return !whole
		}
		if b[0] != '"' {
			return false
		}
		_, n, cut, bad = readQuoted(b, false)
		switch {
		case bad:
			return false
		case cut:
			return !whole
		}
		if b = trimBlank(b[n:]); len(b) == 0 {
			return !whole
		}
		if b[0] != ',' {
			return false // "}" before any name, or worse: the parser fails
		}
		b = b[1:]
	}
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

// filterFamilies returns r, at most maxMetricsBytes (past them Read
// fails with errPageLong), restricted to the lines set keeps
// (familySet.keepLine), without the blanks that lead a line past a
// chunk. The kept lines are charged to hold as they are read; once they
// pass maxKeptBytes, or hold cannot grow, Read fails with errPageSeries
// or errScrapeBudget. The caller releases hold.
func filterFamilies(r io.Reader, set familySet, hold *budget.Hold) io.Reader {
	return &familyFilter{r: bufio.NewReaderSize(&pageLimit{r: r, left: maxMetricsBytes}, filterChunk), set: set, hold: hold}
}

// pageLimit is a page of at most left more bytes; past them Read fails
// with errPageLong (a page cut short would parse as if it had ended).
type pageLimit struct {
	r    io.Reader
	left int64
}

func (l *pageLimit) Read(p []byte) (int, error) {
	if int64(len(p)) > l.left+1 {
		p = p[:l.left+1]
	}
	n, err := l.r.Read(p)
	if l.left -= int64(n); l.left < 0 {
		return 0, errPageLong
	}
	return n, err
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
		case !f.keep && cut && len(trimBlank(chunk)) == 0:
			continue // blanks leading a line: the parser skips them too
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
