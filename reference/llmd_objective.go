package reference

import "github.com/examlops/gateway"

// objectiveMs returns the request's TTFT and TPOT objectives in
// milliseconds, llm-d's x-slo-ttft-ms and x-slo-tpot-ms headers; 0 when
// it has none.
//
// Interim: the gateway's Request does not carry per-request objectives
// yet (Request.Objective is coming); until it does every request has
// none, which is llm-d's behaviour without the headers.
func objectiveMs(*gateway.Request) (ttft, tpot float64) { return 0, 0 }

// outputTokens returns how many tokens the request's answer had, for the
// TPOT sample; 0 when unknown.
//
// Interim: DoneInfo does not carry the count yet (OutputTokens is
// coming); until it does the streaming mode trains no TPOT model.
func outputTokens(gateway.DoneInfo) int { return 0 }
