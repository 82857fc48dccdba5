package gateway

import "errors"

// Sentinel errors. Every error the package returns wraps one of these with
// context naming the field and the value at fault, so errors.Is works and
// the message says what was wrong. Messages start with "gateway:".
var (
	// ErrInvalid is returned for bad input: an empty replica list or key,
	// a replica with no name, a name already taken or an out-of-range
	// capacity, a negative or NaN
	// load signal, an adapter report over its limits, a block size below
	// 1, an option with a bad value, an unknown cache event, a mode name
	// not known, or a Policy that picked no candidate. Nothing is changed.
	ErrInvalid = errors.New("gateway: invalid argument")
	// ErrNoHealthyReplica is returned by Route when no replica is healthy
	// (or allowed by the Target, for RouteWith).
	ErrNoHealthyReplica = errors.New("gateway: no healthy replica")
	// ErrUnknownReplica is returned when an update names a replica the
	// gateway does not have.
	ErrUnknownReplica = errors.New("gateway: unknown replica")
)
