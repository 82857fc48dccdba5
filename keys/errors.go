package keys

import "errors"

// ErrInvalid is wrapped by every error of the package's key builders: a
// block size below 1, naming it and its unit.
var ErrInvalid = errors.New("keys: invalid argument")
