package picker

// usageScan reads the output token count of an OpenAI answer from its
// body as it streams past, in chunks cut anywhere, in constant memory and
// without copying: the value of the last "completion_tokens" key (chat
// and completions usage, in a plain answer or in the last event of a
// stream that asked for stream_options.include_usage) or "output_tokens"
// key (the Responses API's usage). Inside a JSON string every quote is
// escaped, so the key, quotes included, followed by a colon, occurs only
// as a key. A value that is not a plain non-negative integer below 2³¹
// (a fraction, an exponent, a sign, too many digits) is not taken. The
// zero value is ready; a body that is not JSON yields at worst a wrong
// count, never an error.
type usageScan struct {
	mc, mo uint8 // bytes of usageKeyC and usageKeyO matched
	ph     uint8 // scanPh*
	val    int64 // the digits read so far (scanPhNum)
	last   int   // the last value taken, if seen
	seen   bool
}

var (
	usageKeyC = []byte(`"completion_tokens"`)
	usageKeyO = []byte(`"output_tokens"`)
)

const (
	scanPhKey   = iota // looking for a key
	scanPhColon        // after a key, before its colon
	scanPhValue        // after the colon, before the value
	scanPhNum          // in the value's digits
)

// usageMax bounds a count: larger values are not taken.
const usageMax = 1<<31 - 1

// feed scans the next chunk of the body.
func (u *usageScan) feed(b []byte) {
	for _, c := range b {
		u.byte(c)
	}
}

func (u *usageScan) byte(c byte) {
	switch u.ph {
	case scanPhColon:
		switch {
		case space(c):
			return
		case c == ':':
			u.ph = scanPhValue
			return
		}
		u.ph = scanPhKey
	case scanPhValue:
		switch {
		case space(c):
			return
		case c >= '0' && c <= '9':
			u.ph, u.val = scanPhNum, int64(c-'0')
			return
		}
		u.ph = scanPhKey
	case scanPhNum:
		if c >= '0' && c <= '9' {
			if u.val <= usageMax {
				u.val = u.val*10 + int64(c-'0')
			}
			return
		}
		if (space(c) || c == ',' || c == '}') && u.val <= usageMax {
			u.last, u.seen = int(u.val), true
		}
		u.ph = scanPhKey
	}
	// scanPhKey: match both keys at once. A key's only quotes are its
	// first and last bytes, so a quote that does not close a match opens
	// one.
	u.mc = step(usageKeyC, u.mc, c)
	u.mo = step(usageKeyO, u.mo, c)
	if int(u.mc) == len(usageKeyC) || int(u.mo) == len(usageKeyO) {
		u.mc, u.mo, u.ph = 0, 0, scanPhColon
	}
}

// step advances a match of key by c, m bytes being matched.
func step(key []byte, m uint8, c byte) uint8 {
	switch {
	case m > 0 && key[m] == c:
		return m + 1
	case c == '"':
		return 1
	}
	return 0
}

func space(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }

// tokens returns the count read, 0 if none.
func (u *usageScan) tokens() int {
	if !u.seen {
		return 0
	}
	return u.last
}
