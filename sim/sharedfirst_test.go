package sim

// sharedFirst is a workload with every request of w behind one common
// leading block, as when every prompt starts with the same system prompt:
// a replica that never got a request matches nothing, every other replica
// matches that block.
type sharedFirst struct{ w Workload }

func (s sharedFirst) Name() string     { return s.w.Name() + ", one shared first block" }
func (s sharedFirst) BlockTokens() int { return s.w.BlockTokens() }

func (s sharedFirst) Open(seed uint64) (Stream, error) {
	st, err := s.w.Open(seed)
	if err != nil {
		return nil, err
	}
	return &sharedFirstStream{Stream: st, bt: s.w.BlockTokens()}, nil
}

type sharedFirstStream struct {
	Stream
	bt         int
	inner, buf []uint64 // the inner stream's blocks, and the request's
}

// sharedBlock is the id of the common block; ids of w are chained before
// use, so it cannot alias theirs.
const sharedBlock = 1<<63 + 12345

func (s *sharedFirstStream) Next(r *Request) error {
	r.Blocks = s.inner // the inner stream reuses its own slice, never ours
	if err := s.Stream.Next(r); err != nil {
		return err
	}
	s.inner = r.Blocks
	s.buf = append(append(s.buf[:0], sharedBlock), s.inner...)
	r.Blocks = s.buf
	r.InputTokens += s.bt
	r.UserBlock++
	return nil
}
