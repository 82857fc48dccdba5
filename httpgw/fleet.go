package httpgw

import "github.com/examlops/gateway/fleet"

// Names kept for the packages that used them from httpgw before the
// control plane moved to package fleet.
type (
	// ReloadResult is fleet.ReloadResult.
	ReloadResult = fleet.ReloadResult
	// Stats is fleet.Stats, the body of GET /stats.
	Stats = fleet.Stats
	// EngineStats is fleet.EngineStats.
	EngineStats = fleet.EngineStats
)

// ReadPeerToken is fleet.ReadPeerToken.
func ReadPeerToken(path string) ([]byte, error) { return fleet.ReadPeerToken(path) }
