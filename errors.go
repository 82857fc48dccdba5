package gateway

import "errors"

// Sentinel errors. Every error the package returns wraps one of these with
// context naming the field and value, so errors.Is works and the message
// says what was wrong. Messages start with "gateway:".
var (
	// ErrNoReplicas is returned by New when the replica list is empty.
	ErrNoReplicas = errors.New("gateway: no replicas")
	// ErrNoHealthyReplica is returned by Route when no replica is healthy.
	ErrNoHealthyReplica = errors.New("gateway: no healthy replica")
	// ErrDuplicateReplica is returned when two replicas share a name.
	ErrDuplicateReplica = errors.New("gateway: duplicate replica")
	// ErrUnknownReplica is returned when an update names a replica the
	// gateway does not have.
	ErrUnknownReplica = errors.New("gateway: unknown replica")
	// ErrInvalidReplica is returned for a replica with an empty name or an
	// out-of-range cache capacity.
	ErrInvalidReplica = errors.New("gateway: invalid replica")
	// ErrInvalidSignal is returned for a negative, NaN or out-of-range load
	// signal.
	ErrInvalidSignal = errors.New("gateway: invalid load signal")
	// ErrEmptyKey is returned when a nil or empty Key is routed.
	ErrEmptyKey = errors.New("gateway: empty prefix key")
	// ErrInvalidBlockSize is returned for a block size below 1.
	ErrInvalidBlockSize = errors.New("gateway: invalid block size")
	// ErrInvalidOption is returned by New for an option with a bad value.
	ErrInvalidOption = errors.New("gateway: invalid option")
	// ErrInvalidEvent is returned by ApplyEvent for an unknown event kind.
	ErrInvalidEvent = errors.New("gateway: invalid cache event")
	// ErrBadChoice is returned by Route when a Policy picks an index
	// outside the candidate slice.
	ErrBadChoice = errors.New("gateway: policy chose no candidate")
)
