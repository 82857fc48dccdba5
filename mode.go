package gateway

import (
	"fmt"
	"strings"
)

// Mode names one of the built-in policies. The zero value is
// ModeRoundRobin, the default. In text (flags, JSON configuration) a mode
// is its name: round_robin, cache_aware or load_aware.
type Mode int

// The built-in modes.
const (
	// ModeRoundRobin rotates across eligible replicas (RoundRobin).
	ModeRoundRobin Mode = iota
	// ModeCacheAware prefers the replica holding the longest prefix,
	// guarded by load (CacheAware).
	ModeCacheAware
	// ModeLoadAware picks the least loaded replica (LoadAware).
	ModeLoadAware
	numModes
)

// modeNames is the one table of mode names: String, parseMode, the text
// forms and every list of names shown to users come from it.
var modeNames = [numModes]string{"round_robin", "cache_aware", "load_aware"}

// String returns the mode's name: round_robin, cache_aware or load_aware.
func (m Mode) String() string {
	if m >= 0 && m < numModes {
		return modeNames[m]
	}
	return fmt.Sprintf("Mode(%d)", int(m))
}

// parseMode returns the Mode named s (round_robin, cache_aware or
// load_aware; hyphens are accepted for underscores). Any other name is an
// error wrapping ErrInvalid that lists the names.
func parseMode(s string) (Mode, error) {
	for i, n := range modeNames {
		if s == n || s == strings.ReplaceAll(n, "_", "-") {
			return Mode(i), nil
		}
	}
	return 0, fmt.Errorf("%w: mode %q, want %s", ErrInvalid, s, modeList())
}

// MarshalText returns the mode's name; a Mode outside the built-in ones is
// an error wrapping ErrInvalid.
func (m Mode) MarshalText() ([]byte, error) {
	if m < 0 || m >= numModes {
		return nil, fmt.Errorf("%w: mode %d, want one of %s", ErrInvalid, int(m), modeList())
	}
	return []byte(modeNames[m]), nil
}

// UnmarshalText sets m to the mode named by text, as parseMode reads it;
// empty text is the default, ModeRoundRobin, as an absent field is.
func (m *Mode) UnmarshalText(text []byte) error {
	if len(text) == 0 {
		*m = ModeRoundRobin
		return nil
	}
	v, err := parseMode(string(text))
	if err != nil {
		return err
	}
	*m = v
	return nil
}

// modeList is "round_robin, cache_aware or load_aware".
func modeList() string {
	return strings.Join(modeNames[:numModes-1], ", ") + " or " + modeNames[numModes-1]
}
