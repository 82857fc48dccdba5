package sim

import (
	"errors"
	"fmt"
	"io"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// traceLineAt is a valid one-block trace line at timestamp ts (ms).
func traceLineAt(ts string) string {
	return `{"timestamp": ` + ts + `, "input_length": 100, "output_length": 2, "hash_ids": [1]}`
}

// TestTraceTimestampRange: a timestamp beyond time.Duration's range is a
// malformed line naming its line number, not a silently wrapped arrival;
// the largest accepted timestamp decodes exactly.
func TestTraceTimestampRange(t *testing.T) {
	tests := []struct {
		name    string
		ts      string
		ok      bool
		arrival time.Duration
	}{
		{"zero", "0", true, 0},
		{"max", "9e12", true, 9e12 * time.Millisecond},
		{"just over max", "9000000000001", false, 0},
		{"beyond Duration", "1e13", false, 0},
		{"far beyond", "1e300", false, 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := NewTraceDecoder(strings.NewReader("\n"+traceLineAt(tt.ts)+"\n"), 512)
			var r Request
			err := d.Next(&r)
			if tt.ok {
				require.NoError(t, err)
				assert.Equal(t, tt.arrival, r.Arrival)
				return
			}
			require.ErrorIs(t, err, ErrMalformedTrace)
			assert.Contains(t, err.Error(), "line 2:")
			assert.Contains(t, err.Error(), "timestamp")
		})
	}
	t.Run("run fails", func(t *testing.T) {
		w, err := TraceBytes("big", []byte(traceLineAt("1e13")+"\n"+traceLineAt("2e13")+"\n"), TraceOptions{})
		require.NoError(t, err)
		_, err = Run(Config{Workload: w, Replicas: 1})
		require.ErrorIs(t, err, ErrMalformedTrace)
		assert.Contains(t, err.Error(), "line 1")
	})
}

// TestTraceSpeedOverflow: a Speed so small that a scaled arrival leaves
// time.Duration's range fails with ErrInvalidConfig naming Speed and the
// line, rather than wrapping to a negative arrival.
func TestTraceSpeedOverflow(t *testing.T) {
	data := []byte(traceLineAt("0") + "\n" + traceLineAt("1000") + "\n")
	tests := []struct {
		name  string
		speed float64
		ok    bool
	}{
		{"normal", 0.5, true},
		{"slow but in range", 1e-8, true}, // 1 s becomes about 3.2 years
		{"overflows", 1e-10, false},
		{"tiny", 1e-300, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			w, err := TraceBytes("speed", data, TraceOptions{Speed: tt.speed})
			require.NoError(t, err)
			st, err := w.Open(1)
			require.NoError(t, err)
			defer st.Close()
			var r Request
			require.NoError(t, st.Next(&r)) // timestamp 0 never overflows
			err = st.Next(&r)
			if tt.ok {
				require.NoError(t, err)
				assert.Equal(t, time.Duration(float64(time.Second)/tt.speed), r.Arrival)
				assert.Equal(t, io.EOF, st.Next(&r))
				return
			}
			require.ErrorIs(t, err, ErrInvalidConfig)
			assert.Contains(t, err.Error(), "Speed")
			assert.Contains(t, err.Error(), "line 2")
			assert.True(t, strings.HasPrefix(err.Error(), "gateway:"))
			_, err = Run(Config{Workload: w, Replicas: 1})
			require.ErrorIs(t, err, ErrInvalidConfig)
		})
	}
}

// TestTraceCountsRequestsNotLines: blank and whitespace-only lines, which
// the decoder skips, are not requests: the workload's name, its stream's
// Len and the report's request count all agree with the decoded requests.
func TestTraceCountsRequestsNotLines(t *testing.T) {
	one := traceLineAt("5")
	tests := []struct {
		name, data string
		want       int
	}{
		{"blank lines after", one + "\n\n\n\n", 1},
		{"blank lines around", "\n \t\n" + one + "\r\n\r\n" + traceLineAt("6") + "\n  \n", 2},
		{"no final newline", one + "\n" + traceLineAt("6"), 2},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := t.TempDir() + "/x.jsonl"
			require.NoError(t, os.WriteFile(path, []byte(tt.data), 0o600))
			fromFile, err := TraceFile(path, TraceOptions{})
			require.NoError(t, err)
			fromBytes, err := TraceBytes("x.jsonl", []byte(tt.data), TraceOptions{})
			require.NoError(t, err)
			for _, w := range []Workload{fromFile, fromBytes} {
				assert.Contains(t, w.Name(), fmt.Sprintf("trace x.jsonl: %d requests,", tt.want))
				st, err := w.Open(1)
				require.NoError(t, err)
				assert.Equal(t, tt.want, st.Len())
				require.NoError(t, st.Close())
				rep, err := Run(Config{Workload: w, Replicas: 1})
				require.NoError(t, err)
				assert.Equal(t, tt.want, rep.Requests)
				assert.Equal(t, tt.want, rep.Results[0].Requests)
			}
		})
	}
}

// TestTraceWithoutRequests: a trace with no request (an empty file, blank
// lines only, or a first line too long to read) is an invalid config that
// names the trace, from a file and from bytes; it never becomes a run
// reporting zeros.
func TestTraceWithoutRequests(t *testing.T) {
	tests := []struct{ name, data, msg string }{
		{"empty", "", "no requests: the file is empty"},
		{"only blank", "\n\n \t\r\n", "no requests: its 3 lines are all blank"},
		{"first line too long", strings.Repeat("x", maxTraceLine+1) + "\n" + traceLineAt("1"), "line 1: longer than"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			path := t.TempDir() + "/x.jsonl"
			require.NoError(t, os.WriteFile(path, []byte(tt.data), 0o600))
			_, err := TraceFile(path, TraceOptions{})
			require.ErrorIs(t, err, ErrInvalidConfig)
			assert.Contains(t, err.Error(), "trace "+path+": "+tt.msg)
			_, err = TraceBytes("x.jsonl", []byte(tt.data), TraceOptions{})
			require.ErrorIs(t, err, ErrInvalidConfig)
			assert.Contains(t, err.Error(), "trace x.jsonl: "+tt.msg)
		})
	}
}

// FuzzTraceBytes: any bytes either fail TraceBytes with ErrInvalidConfig
// naming the trace (an empty trace among them), or give a workload of at
// least one request whose stream yields exactly Len requests, each valid
// and in arrival order, unless a line is malformed (ErrMalformedTrace
// naming the line). It never panics.
func FuzzTraceBytes(f *testing.F) {
	f.Add("")
	f.Add("\n \n\t\n")
	f.Add(traceLineAt("1") + "\n" + traceLineAt("2") + "\n")
	f.Add(traceLineAt("1") + "\n\n{oops\n")
	f.Add(traceLineAt("2") + "\n" + traceLineAt("1") + "\n")
	f.Add(`{"timestamp": 0, "input_length": 1025, "output_length": 0, "hash_ids": [0, 1, 2]}`)
	f.Add("null\n")
	f.Fuzz(func(t *testing.T, data string) {
		w, err := TraceBytes("fuzz.jsonl", []byte(data), TraceOptions{})
		if err != nil {
			if !errors.Is(err, ErrInvalidConfig) || !strings.Contains(err.Error(), "trace fuzz.jsonl: ") {
				t.Fatalf("error %q lacks the sentinel or the trace's name", err)
			}
			return
		}
		st, err := w.Open(1)
		if err != nil {
			t.Fatal(err)
		}
		defer st.Close()
		if st.Len() < 1 {
			t.Fatalf("accepted a trace of %d requests", st.Len())
		}
		var r Request
		n, last := 0, time.Duration(0)
		for {
			err := st.Next(&r)
			if err == io.EOF {
				break
			}
			if err != nil {
				if !errors.Is(err, ErrMalformedTrace) || !strings.Contains(err.Error(), "line ") {
					t.Fatalf("error %q lacks a line number or sentinel", err)
				}
				return
			}
			if r.InputTokens < 1 || len(r.Blocks) != (r.InputTokens+MooncakeBlockTokens-1)/MooncakeBlockTokens || r.Arrival < last {
				t.Fatalf("accepted an invalid request %+v", r)
			}
			last = r.Arrival
			n++
		}
		if n != st.Len() {
			t.Fatalf("streamed %d requests, Len says %d", n, st.Len())
		}
	})
}

// TestTraceFileUnreadable: a path that cannot be read as a trace is an
// invalid config.
func TestTraceFileUnreadable(t *testing.T) {
	for _, p := range []string{t.TempDir() + "/absent.jsonl", t.TempDir()} {
		_, err := TraceFile(p, TraceOptions{})
		require.ErrorIs(t, err, ErrInvalidConfig, p)
		assert.True(t, strings.HasPrefix(err.Error(), "gateway:"))
	}
}

// TestPoissonRateOverflow: a Rate so small that a Poisson arrival leaves
// time.Duration's range fails the stream with ErrInvalidConfig naming the
// workload and Rate, for the generators and for a trace replayed at Rate;
// it never wraps to a negative arrival.
func TestPoissonRateOverflow(t *testing.T) {
	mk := func(w Workload, err error) Workload {
		require.NoError(t, err)
		return w
	}
	const tiny = 1e-300
	tests := []struct {
		name string
		w    Workload
	}{
		{"shared-prefix", mk(SharedPrefix(SharedPrefixConfig{Requests: 3, Rate: tiny}))},
		{"chat", mk(Chat(ChatConfig{Requests: 3, Rate: tiny}))},
		{"rag", mk(RAG(RAGConfig{Requests: 3, Rate: tiny}))},
		{"system-prompt", mk(SystemPrompt(SystemPromptConfig{Requests: 3, Rate: tiny}))},
		{"low-sharing", mk(LowSharing(LowSharingConfig{Requests: 3, Rate: tiny}))},
		{"trace", mk(TraceBytes("x", []byte(traceLineAt("1")+"\n"+traceLineAt("2")+"\n"), TraceOptions{Rate: tiny}))},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			st, err := tt.w.Open(1)
			require.NoError(t, err)
			defer st.Close()
			var r Request
			err = st.Next(&r)
			require.ErrorIs(t, err, ErrInvalidConfig)
			assert.Contains(t, err.Error(), tt.name+": Rate 1e-300")
			assert.True(t, strings.HasPrefix(err.Error(), "gateway:"))
			_, err = Run(Config{Workload: tt.w, Replicas: 1})
			require.ErrorIs(t, err, ErrInvalidConfig)
		})
	}
}
