package apikeys

import (
	"crypto/sha256"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/examlops/gateway/internal/memtest"
	"github.com/stretchr/testify/require"
)

func TestParse(t *testing.T) {
	set, err := Parse([]byte("# clients\n\n  sk-alpha-0001  \nsk-beta-00002\r\n# end"))
	require.NoError(t, err)
	require.Len(t, set, 2)
	require.Contains(t, set, sha256.Sum256([]byte("sk-alpha-0001")))
	for _, tc := range []struct{ in, want string }{
		{"", "no key in it"},
		{"# only a comment\n", "no key in it"},
		{"sk-ok-00001\nshort\n", "line 2: a key of 5 bytes, want at least 8"},
		{strings.Repeat("k", MaxKeyBytes+1), "line 1: a key of 4097 bytes"},
		{strings.Repeat("k", MaxKeyBytes+2000), "line 1: over 5120 bytes"},
		{"sk-ok-00001\n# " + strings.Repeat("c", MaxKeyBytes+2000), "line 2: over 5120 bytes"},
		{"sk-two words\n", "line 1: a key holds a space"},
		{"sk-\x00nul-key\n", "line 1: a key holds a space, a control character"},
		{"sk-é-keyyyy\n", "outside ASCII"},
		{"sk-same-0001\nsk-same-0001\n", "line 2: a key listed twice"},
	} {
		_, err := Parse([]byte(tc.in))
		require.ErrorContains(t, err, tc.want, "%q", tc.in)
	}
	var many strings.Builder
	for i := range MaxKeys + 1 {
		many.WriteString("sk-key-" + strconv.Itoa(i) + "\n")
	}
	_, err = Parse([]byte(many.String()))
	require.ErrorContains(t, err, "more than 65536 keys")
}

// FuzzParse: any file is read or refused with an error, never a panic;
// every key read is allowed, and one not in the file is not.
func FuzzParse(f *testing.F) {
	f.Add([]byte("sk-alpha-0001\n# c\nsk-beta-00002"))
	f.Add([]byte("\r\n\r\n short \n"))
	f.Fuzz(func(t *testing.T, b []byte) {
		set, err := Parse(b)
		if err != nil {
			return
		}
		for _, line := range strings.Split(string(b), "\n") {
			k := strings.TrimSpace(line)
			if k == "" || k[0] == '#' {
				continue
			}
			if _, ok := set[sha256.Sum256([]byte(k))]; !ok {
				t.Fatalf("key %q of the file not kept", k)
			}
		}
		if _, ok := set[sha256.Sum256([]byte("\x00 not a key"))]; ok {
			t.Fatal("a key not in the file kept")
		}
	})
}

// TestFile: keys are checked by the Bearer scheme in any case; a changed
// file is read once a second has passed; a file that no longer reads
// keeps the last keys in force, its error reported once.
func TestFile(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys")
	require.NoError(t, os.WriteFile(path, []byte("sk-first-key\n"), 0o600))
	var mu sync.Mutex
	now := time.Unix(1000, 0)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	advance := func(d time.Duration) { mu.Lock(); now = now.Add(d); mu.Unlock() }
	f, err := Load(path, clock)
	require.NoError(t, err)
	require.True(t, f.Allowed("Bearer sk-first-key"))
	require.True(t, f.Allowed("bearer   sk-first-key"))
	for _, v := range []string{"", "sk-first-key", "Basic sk-first-key", "Bearer sk-first-keY", "Bearer sk-first-key "} {
		require.False(t, f.Allowed(v), "%q", v)
	}
	require.EqualValues(t, 5, f.Rejected())

	require.NoError(t, os.WriteFile(path, []byte("sk-second-key\n# more\n"), 0o600))
	require.NoError(t, os.Chtimes(path, time.Now(), time.Now().Add(time.Hour)))
	require.NoError(t, f.Refresh())
	require.True(t, f.Allowed("Bearer sk-first-key"), "not looked at within the second")
	advance(time.Second)
	require.NoError(t, f.Refresh())
	require.False(t, f.Allowed("Bearer sk-first-key"))
	require.True(t, f.Allowed("Bearer sk-second-key"))

	require.NoError(t, os.WriteFile(path, []byte("bad\n"), 0o600))
	require.NoError(t, os.Chtimes(path, time.Now(), time.Now().Add(2*time.Hour)))
	advance(time.Second)
	require.ErrorContains(t, f.Refresh(), "line 1: a key of 3 bytes")
	advance(time.Second)
	require.NoError(t, f.Refresh(), "the same error is reported once")
	require.True(t, f.Allowed("Bearer sk-second-key"), "the last keys stay in force")
	require.Equal(t, 1, f.Len())

	_, err = Load(filepath.Join(t.TempDir(), "missing"), nil)
	require.ErrorContains(t, err, "API keys file: ")
}

// FuzzAllowed: on any Authorization value, Allowed admits exactly
// "Bearer" in any case, one or more spaces, and a key of the file.
func FuzzAllowed(f *testing.F) {
	path := filepath.Join(f.TempDir(), "keys")
	if err := os.WriteFile(path, []byte("sk-fuzz-key-1\n"), 0o600); err != nil {
		f.Fatal(err)
	}
	file, err := Load(path, nil)
	if err != nil {
		f.Fatal(err)
	}
	for _, s := range []string{"Bearer sk-fuzz-key-1", "BEARER  sk-fuzz-key-1", "Bearer sk-fuzz-key-", "Basic x", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, v string) {
		scheme, rest, spaced := strings.Cut(v, " ")
		want := spaced && strings.EqualFold(scheme, "bearer") && strings.TrimLeft(rest, " ") == "sk-fuzz-key-1"
		if got := file.Allowed(v); got != want {
			t.Fatalf("Allowed(%q) = %v", v, got)
		}
	})
}

// TestAllowedAllocatesNothing: checking a request's key, of the length
// of an OpenAI key, allocates nothing.
func TestAllowedAllocatesNothing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "keys")
	const key = "sk-proj-0123456789abcdef0123456789abcdef0123456789"
	require.NoError(t, os.WriteFile(path, []byte(key+"\n"), 0o600))
	f, err := Load(path, nil)
	require.NoError(t, err)
	require.Zero(t, testing.AllocsPerRun(100, func() {
		if !f.Allowed("Bearer " + key) {
			t.Fatal("refused")
		}
	}))
}

// TestMeasureKeysMemory prints what a keys file at the bound (MaxKeys
// keys of 55 bytes) holds once loaded, and the process's peak RSS while
// it loads: the figures of docs/security.md.
//
//	EXA_MEASURE=1 go test ./internal/apikeys -run TestMeasureKeysMemory -count=1 -v
func TestMeasureKeysMemory(t *testing.T) {
	if os.Getenv("EXA_MEASURE") == "" {
		t.Skip("measurement: set EXA_MEASURE=1")
	}
	var b strings.Builder
	for i := range MaxKeys {
		b.WriteString("sk-proj-" + strings.Repeat("x", 40) + strconv.Itoa(1000000+i) + "\n")
	}
	path := filepath.Join(t.TempDir(), "keys")
	require.NoError(t, os.WriteFile(path, []byte(b.String()), 0o600))
	before := memtest.LiveHeap()
	var f *File
	rss := memtest.PeakRSS(func() {
		var err error
		f, err = Load(path, nil)
		require.NoError(t, err)
	})
	after := memtest.LiveHeap()
	t.Logf("%d keys, a file of %.1f MiB: %.2f MiB held; peak RSS while loading +%.1f MiB",
		f.Len(), float64(b.Len())/(1<<20), float64(after-before)/(1<<20), float64(rss)/(1<<20))
	runtime.KeepAlive(f)
}
