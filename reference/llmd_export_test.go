package reference

// LLMDSamples returns the TTFT samples p's predictor holds, for the
// external tests.
func LLMDSamples(p *LLMDPredicted) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.trainer == nil {
		return 0
	}
	return p.trainer.ttftData.n
}
