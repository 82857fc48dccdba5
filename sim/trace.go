package sim

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"path/filepath"
	"time"
)

// MooncakeBlockTokens is the number of tokens per hash id in Mooncake
// traces: 512.
const MooncakeBlockTokens = 512

// maxTraceLine bounds one trace line: 64 MiB.
const maxTraceLine = 64 << 20

// MaxTraceTimestamp is the largest timestamp, in milliseconds, a trace
// line may carry: 9e12 ms (about 285 years), so that every timestamp fits
// a time.Duration (at most about 9.22e12 ms).
const MaxTraceTimestamp = 9e12

// maxDurationF is 2^63, the first float64 beyond time.Duration's range.
const maxDurationF = float64(math.MaxInt64)

// TraceDecoder reads a Mooncake-format JSONL trace: one JSON object per
// line with timestamp (milliseconds, non-decreasing, at most
// MaxTraceTimestamp), input_length (> 0),
// output_length (>= 0) and hash_ids (ceil(input_length / block tokens)
// non-negative ids). Blank lines are skipped; unknown fields are ignored.
// Request.UserBlock is inferred from the prefixes shared by the requests
// read so far (see userStart).
// A TraceDecoder is not safe for concurrent use.
type TraceDecoder struct {
	sc   *bufio.Scanner
	bt   int
	line int
	last float64
	user userStart
}

// NewTraceDecoder returns a decoder reading r, whose hash ids each stand for
// blockTokens tokens (0 means MooncakeBlockTokens).
func NewTraceDecoder(r io.Reader, blockTokens int) *TraceDecoder {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), maxTraceLine)
	return &TraceDecoder{sc: sc, bt: orDefault(blockTokens, MooncakeBlockTokens)}
}

// Line returns the number of the last line read, counting from 1.
func (d *TraceDecoder) Line() int { return d.line }

type traceLine struct {
	Timestamp    *float64 `json:"timestamp"`
	InputLength  *int64   `json:"input_length"`
	OutputLength *int64   `json:"output_length"`
	HashIDs      *[]int64 `json:"hash_ids"`
}

// Next decodes the next request into r, with Arrival the recorded
// timestamp. It returns io.EOF at the end, and for a malformed line an error
// wrapping ErrMalformedTrace that names the line.
func (d *TraceDecoder) Next(r *Request) error {
	for d.sc.Scan() {
		d.line++
		b := bytes.TrimSpace(d.sc.Bytes())
		if len(b) == 0 {
			continue
		}
		return d.parse(b, r)
	}
	if err := d.sc.Err(); err != nil {
		if errors.Is(err, bufio.ErrTooLong) {
			return fmt.Errorf("%w: line %d: longer than %d bytes", ErrMalformedTrace, d.line+1, maxTraceLine)
		}
		return fmt.Errorf("%w: after line %d: %v", ErrMalformedTrace, d.line, err)
	}
	return io.EOF
}

func (d *TraceDecoder) bad(format string, a ...any) error {
	return fmt.Errorf("%w: line %d: %s", ErrMalformedTrace, d.line, fmt.Sprintf(format, a...))
}

func (d *TraceDecoder) parse(b []byte, r *Request) error {
	var t traceLine
	if err := json.Unmarshal(b, &t); err != nil {
		return d.bad("%v", err)
	}
	switch {
	case t.Timestamp == nil:
		return d.bad("missing timestamp")
	case t.InputLength == nil:
		return d.bad("missing input_length")
	case t.OutputLength == nil:
		return d.bad("missing output_length")
	case t.HashIDs == nil:
		return d.bad("missing hash_ids")
	}
	ts, in, out, ids := *t.Timestamp, *t.InputLength, *t.OutputLength, *t.HashIDs
	const maxTokens = 1 << 30
	switch {
	case math.IsNaN(ts) || ts < 0 || ts > MaxTraceTimestamp:
		return d.bad("timestamp %v must be within 0..%g ms", ts, float64(MaxTraceTimestamp))
	case ts < d.last:
		return d.bad("timestamp %v is before the previous line's %v", ts, d.last)
	case in < 1 || in > maxTokens:
		return d.bad("input_length %d must be within 1..%d", in, maxTokens)
	case out < 0 || out > maxTokens:
		return d.bad("output_length %d must be within 0..%d", out, maxTokens)
	case int64(len(ids)) != (in+int64(d.bt)-1)/int64(d.bt):
		return d.bad("%d hash_ids for input_length %d, want ceil(%d/%d) = %d", len(ids), in, in, d.bt, (in+int64(d.bt)-1)/int64(d.bt))
	}
	r.Blocks = r.Blocks[:0]
	for i, id := range ids {
		if id < 0 {
			return d.bad("hash_ids[%d] = %d is negative", i, id)
		}
		r.Blocks = append(r.Blocks, uint64(id))
	}
	d.last = ts
	r.Arrival = time.Duration(ts * float64(time.Millisecond))
	r.InputTokens, r.OutputTokens = int(in), int(out)
	r.OutBlocks = r.OutBlocks[:0]
	r.UserBlock = d.user.block(r.Blocks)
	return nil
}

// TraceOptions configures the replay of a trace. The zero value replays it
// at its recorded arrival times.
type TraceOptions struct {
	// Speed divides the recorded inter-arrival times: 2 replays twice as
	// fast. Zero means 1. A Speed so small that a scaled arrival time
	// exceeds time.Duration's range fails the run with ErrInvalidConfig
	// naming the line.
	Speed float64
	// Rate, when positive, replaces the recorded arrival times with Poisson
	// arrivals at Rate requests per second. A Rate so small that an
	// arrival exceeds time.Duration's range fails the run with
	// ErrInvalidConfig, as it does for the generated workloads.
	Rate float64
	// Limit, when positive, replays only the first Limit requests.
	Limit int
	// BlockTokens is the number of tokens per hash id; zero means
	// MooncakeBlockTokens.
	BlockTokens int
}

func (o *TraceOptions) check() error {
	switch {
	case o.Speed < 0 || math.IsNaN(o.Speed) || math.IsInf(o.Speed, 0):
		return fmt.Errorf("%w: trace: Speed %v must be a finite value >= 0", ErrInvalidConfig, o.Speed)
	case o.Rate < 0 || math.IsNaN(o.Rate) || math.IsInf(o.Rate, 0):
		return fmt.Errorf("%w: trace: Rate %v must be a finite value >= 0", ErrInvalidConfig, o.Rate)
	case o.Limit < 0:
		return fmt.Errorf("%w: trace: Limit %d is negative", ErrInvalidConfig, o.Limit)
	case o.BlockTokens < 0:
		return fmt.Errorf("%w: trace: BlockTokens %d is negative", ErrInvalidConfig, o.BlockTokens)
	}
	o.Speed = orDefault(o.Speed, 1)
	o.BlockTokens = orDefault(o.BlockTokens, MooncakeBlockTokens)
	return nil
}

// TraceFile returns the workload replaying the Mooncake-format JSONL trace
// at path (see TraceDecoder). TraceFile reads the file once, a line at a
// time, to count its requests (its non-blank lines); every Open reads it
// anew, a line at a time. A trace without requests (an empty file, or
// blank lines only) is an error wrapping ErrInvalidConfig that names it: a
// run of it would report nothing but zeros. A malformed line fails the run
// with its line number.
func TraceFile(path string, o TraceOptions) (Workload, error) {
	if err := o.check(); err != nil {
		return nil, err
	}
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("%w: trace: %v", ErrInvalidConfig, err)
	}
	defer f.Close()
	n, err := countRequests(f)
	if err != nil {
		return nil, fmt.Errorf("%w: trace %s: %v", ErrInvalidConfig, path, err)
	}
	return &traceWorkload{path: path, o: o, lines: n}, nil
}

// TraceBytes is TraceFile over a trace held in memory; name labels it.
func TraceBytes(name string, data []byte, o TraceOptions) (Workload, error) {
	if err := o.check(); err != nil {
		return nil, err
	}
	n, err := countRequests(bytes.NewReader(data))
	if err != nil {
		return nil, fmt.Errorf("%w: trace %s: %v", ErrInvalidConfig, name, err)
	}
	return &traceWorkload{path: name, data: data, o: o, lines: n}, nil
}

// countRequests counts the lines of r that TraceDecoder would decode: the
// non-blank ones. It streams r a line at a time. A line longer than
// maxTraceLine ends the count there without an error: replaying the trace
// reports that line as malformed, with its number; but when it comes
// before any request, it is the error. No requests at all is an error.
func countRequests(r io.Reader) (int, error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 64<<10), maxTraceLine)
	n, lines := 0, 0
	for sc.Scan() {
		lines++
		if len(bytes.TrimSpace(sc.Bytes())) > 0 {
			n++
		}
	}
	err := sc.Err()
	switch {
	case n == 0 && errors.Is(err, bufio.ErrTooLong):
		return 0, fmt.Errorf("line %d: longer than %d bytes", lines+1, maxTraceLine)
	case err != nil && !errors.Is(err, bufio.ErrTooLong):
		return 0, err
	case n == 0 && lines == 0:
		return 0, errors.New("no requests: the file is empty")
	case n == 0:
		return 0, fmt.Errorf("no requests: its %d lines are all blank", lines)
	}
	return n, nil
}

type traceWorkload struct {
	path  string
	data  []byte
	o     TraceOptions
	lines int // non-blank lines: the requests the trace holds
}

func (w *traceWorkload) Name() string {
	arr := fmt.Sprintf("recorded arrivals ×%g", w.o.Speed)
	if w.o.Rate > 0 {
		arr = fmt.Sprintf("Poisson %g/s", w.o.Rate)
	}
	n := w.lines
	if w.o.Limit > 0 {
		n = min(n, w.o.Limit)
	}
	return fmt.Sprintf("trace %s: %d requests, %s, %d tokens per block", filepath.Base(w.path), n, arr, w.o.BlockTokens)
}

func (w *traceWorkload) BlockTokens() int { return w.o.BlockTokens }

func (w *traceWorkload) Open(seed uint64) (Stream, error) {
	s := &traceStream{o: w.o, n: w.lines}
	if w.o.Limit > 0 {
		s.n = min(s.n, w.o.Limit)
	}
	if w.data != nil {
		s.dec = NewTraceDecoder(bytes.NewReader(w.data), w.o.BlockTokens)
	} else {
		f, err := os.Open(w.path)
		if err != nil {
			return nil, fmt.Errorf("%w: trace: %v", ErrInvalidConfig, err)
		}
		s.f = f
		s.dec = NewTraceDecoder(f, w.o.BlockTokens)
	}
	if w.o.Rate > 0 {
		s.arr = &poisson{rng: newRand(seed, 6), rate: w.o.Rate, name: "trace"}
	}
	return s, nil
}

type traceStream struct {
	o    TraceOptions
	f    *os.File
	dec  *TraceDecoder
	arr  *poisson
	n, i int
}

func (s *traceStream) Next(r *Request) error {
	if s.o.Limit > 0 && s.i >= s.o.Limit {
		return io.EOF
	}
	if err := s.dec.Next(r); err != nil {
		return err
	}
	s.i++
	if s.arr != nil {
		r.Arrival = s.arr.next()
		if s.arr.err != nil {
			return s.arr.err
		}
	} else if s.o.Speed != 1 {
		a := float64(r.Arrival) / s.o.Speed
		if a >= maxDurationF {
			return fmt.Errorf("%w: trace: Speed %v puts line %d's timestamp %v ms at %.4g ms, beyond time.Duration's range (about 9.22e12 ms)",
				ErrInvalidConfig, s.o.Speed, s.dec.Line(), float64(r.Arrival)/float64(time.Millisecond), a/float64(time.Millisecond))
		}
		r.Arrival = time.Duration(a)
	}
	return nil
}

func (s *traceStream) Len() int { return s.n }

func (s *traceStream) Close() error {
	if s.f != nil {
		return s.f.Close()
	}
	return nil
}
