package kvevents

import (
	"bytes"
	"encoding/binary"
	"testing"
)

// splitFrames cuts data into frames at the offsets in cuts (each byte an
// offset from the previous cut, modulo what is left).
func splitFrames(data, cuts []byte) [][]byte {
	var out [][]byte
	for _, c := range cuts {
		n := 0
		if len(data) > 0 {
			n = int(c) % (len(data) + 1)
		}
		out = append(out, data[:n])
		data = data[n:]
	}
	return append(out, data)
}

// joinFrames is the inverse of splitFrames for seeds.
func joinFrames(frames ...[]byte) (data, cuts []byte) {
	for _, f := range frames[:len(frames)-1] {
		data = append(data, f...)
		cuts = append(cuts, byte(len(f)))
	}
	return append(data, frames[len(frames)-1]...), cuts
}

// FuzzReplayFrame feeds arbitrary messages, as a replay endpoint would
// send them, to ReplayFrame and what it returns to the Decoder: no
// panic; a message read without error has the delimiter, an 8-byte
// sequence and, unless it is the end marker, its last frame as payload.
func FuzzReplayFrame(f *testing.F) {
	seq := binary.BigEndian.AppendUint64(nil, 7)
	end := binary.BigEndian.AppendUint64(nil, ReplayEnd)
	add := func(frames ...[]byte) { data, cuts := joinFrames(frames...); f.Add(data, cuts) }
	for _, p := range fuzzSeeds(f)[:3] { // the payload, last, is not cut
		add([]byte{}, seq, p)
		add([]byte{}, []byte(replayTopic), seq, p)
	}
	add([]byte{}, end, []byte{})
	add([]byte{}, []byte{}, end, []byte{})
	add([]byte{}, end, []byte{1})
	add([]byte{0}, seq, []byte{0x90})
	add([]byte{}, seq[:7], []byte{0x90})
	add([]byte{}, seq, []byte{0x90}, []byte{0x90}, []byte{0x90})
	lim := Limits{MaxEvents: 64, MaxBlocks: 64, MaxTokens: 256}
	f.Fuzz(func(t *testing.T, data, cuts []byte) {
		if len(cuts) > 8 {
			cuts = cuts[:8]
		}
		frames := splitFrames(data, cuts)
		s, payload, isEnd, err := ReplayFrame(frames)
		if err != nil {
			return
		}
		if len(frames[0]) != 0 || (len(frames) != 3 && len(frames) != 4) {
			t.Fatalf("accepted %d frames, first of %d bytes", len(frames), len(frames[0]))
		}
		sf := frames[len(frames)-2]
		if len(sf) != 8 || binary.BigEndian.Uint64(sf) != s {
			t.Fatalf("sequence %d from frame %x", s, sf)
		}
		if isEnd != (s == ReplayEnd) || (isEnd && payload != nil) {
			t.Fatalf("end %v at sequence %x with %d-byte payload", isEnd, s, len(payload))
		}
		if !isEnd && !bytes.Equal(payload, frames[len(frames)-1]) {
			t.Fatal("payload is not the last frame")
		}
		_ = NewDecoder(lim).Decode(payload, func(*Event, error) {})
	})
}
