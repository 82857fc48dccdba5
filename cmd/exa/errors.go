package main

import (
	"errors"
	"fmt"

	"github.com/examlops/gateway/config"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// usageError marks bad input: exit status 2.
type usageError struct{ err error }

func (e *usageError) Error() string { return e.err.Error() }
func (e *usageError) Unwrap() error { return e.err }

// usagef returns a usage error with a formatted message.
func usagef(format string, args ...any) error {
	return &usageError{fmt.Errorf(format, args...)}
}

// exitCode maps an error to the process exit status: 2 for usage errors
// and bad configuration files, 1 otherwise.
func exitCode(err error) int {
	var ue *usageError
	if errors.As(err, &ue) || errors.Is(err, config.ErrCorrupt) || errors.Is(err, config.ErrInvalid) {
		return 2
	}
	return 1
}

// flagError rewrites pflag's parse errors as one-line usage errors naming
// the flag and value.
func flagError(_ *cobra.Command, err error) error {
	var ive *pflag.InvalidValueError
	if errors.As(err, &ive) {
		return usagef("invalid --%s %q: %v", ive.GetFlag().Name, ive.GetValue(), errors.Unwrap(ive))
	}
	return &usageError{err}
}

// modelArg checks the MODEL positional argument.
func modelArg(cmd *cobra.Command, args []string) error {
	if len(args) != 1 {
		return usagef("%s takes exactly one MODEL argument, got %d (see %s --help)", cmd.CommandPath(), len(args), cmd.CommandPath())
	}
	if err := config.ValidateModelName(args[0]); err != nil {
		var fe *config.FieldError
		if errors.As(err, &fe) {
			return usagef("invalid MODEL %q: %s", fe.Value, fe.Reason)
		}
		return &usageError{err}
	}
	return nil
}

// noArgs rejects positional arguments.
func noArgs(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usagef("%s takes no arguments, got %q", cmd.CommandPath(), args[0])
	}
	return nil
}

// groupRun is the Run of a command that only groups subcommands: help
// without arguments, a usage error for an unknown subcommand.
func groupRun(cmd *cobra.Command, args []string) error {
	if len(args) > 0 {
		return usagef("unknown command %q for %q (see %s --help)", args[0], cmd.CommandPath(), cmd.CommandPath())
	}
	return cmd.Help()
}

// exclusive returns a usage error if both flags of any pair were given.
func exclusive(cmd *cobra.Command, pairs [][2]string) error {
	for _, p := range pairs {
		if cmd.Flags().Changed(p[0]) && cmd.Flags().Changed(p[1]) {
			return usagef("--%s and --%s cannot be used together", p[0], p[1])
		}
	}
	return nil
}
