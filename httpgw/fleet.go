package httpgw

import (
	"io"

	"github.com/examlops/gateway"
	"github.com/examlops/gateway/fleet"
)

// Names kept for the packages that used them from httpgw before the
// control plane moved to package fleet; each is fleet's of the same name.
type (
	ReloadResult   = fleet.ReloadResult
	Stats          = fleet.Stats
	EngineStats    = fleet.EngineStats
	EngineLoad     = fleet.EngineLoad
	EngineAdapters = fleet.EngineAdapters
	KVEventsGlobal = fleet.KVEventsGlobal
)

// ErrScrape is fleet.ErrScrape.
var ErrScrape = fleet.ErrScrape

// MaxLoadCount is fleet.MaxLoadCount.
const MaxLoadCount = fleet.MaxLoadCount

// ReadPeerToken is fleet.ReadPeerToken.
func ReadPeerToken(path string) ([]byte, error) { return fleet.ReadPeerToken(path) }

// NormalizeAddress is fleet.NormalizeAddress.
func NormalizeAddress(addr string) string { return fleet.NormalizeAddress(addr) }

// ParseEngineMetrics is fleet.ParseEngineMetrics.
func ParseEngineMetrics(r io.Reader) (gateway.Load, error) { return fleet.ParseEngineMetrics(r) }

// ParseEngineMetricsFor is fleet.ParseEngineMetricsFor.
func ParseEngineMetricsFor(r io.Reader, engine string) (gateway.Load, string, error) {
	return fleet.ParseEngineMetricsFor(r, engine)
}
