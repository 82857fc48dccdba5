// Command exa is the operator command line of the gateway: it stores each
// model's routing configuration, simulates routing policies on a workload,
// shows routing statistics and runs the HTTP gateway.
//
//	exa serve routing set MODEL [flags]      store a model's routing configuration
//	exa serve routing get MODEL              show it
//	exa serve routing list                   list configured models
//	exa serve routing delete MODEL           remove a model
//	exa serve routing simulate MODEL [flags] compare policies in simulation
//	exa serve routing stats MODEL            configuration and routing statistics
//	exa serve gateway [flags]                run the OpenAI-compatible HTTP gateway
//	exa serve picker [flags]                 serve the routing to Envoy as an endpoint picker
//	exa --pool-name POOL [picker flags]      the same, as GIE's chart starts its picker
//	exa completion bash|zsh|fish|powershell  shell completion script
//
// The configuration file is $EXA_CONFIG when set, else routing.json in the
// exa directory of the user's configuration directory
// (~/.config/exa/routing.json on Linux); --config overrides both. Its format
// is documented in package github.com/examlops/gateway/config.
//
// Exit status: 0 on success, 2 for bad input (unknown command or flag, a
// flag value out of range, an empty model name, a corrupt configuration
// file), 1 for any other failure.
package main

import (
	"io"
	"os"
	"strings"

	"github.com/spf13/cobra"
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run executes the command line args and returns the exit status.
func run(args []string, stdout, stderr io.Writer) int {
	root := rootCmd
	args = gieInvocation(root, args)
	root.SetArgs(args)
	root.SetOut(stdout)
	root.SetErr(stderr)
	cmd, err := root.ExecuteC()
	if err == nil {
		return 0
	}
	errorLine(stderr, jsonLogs(cmd), "exa: "+oneLine(strings.TrimPrefix(err.Error(), "gateway: ")))
	return exitCode(err)
}

// gieInvocation returns args, preceded by "serve picker" when they start
// with a flag of `exa serve picker` that exa itself does not have: GIE's
// InferencePool chart gives its endpoint picker's container arguments and
// no command, so with this image the process gets GIE's picker flags
// alone (docs/kubernetes.md).
func gieInvocation(root *cobra.Command, args []string) []string {
	if len(args) == 0 || !strings.HasPrefix(args[0], "--") {
		return args
	}
	name, _, _ := strings.Cut(strings.TrimPrefix(args[0], "--"), "=")
	picker, _, err := root.Find([]string{"serve", "picker"})
	if err != nil || picker.Name() != "picker" || root.Flags().Lookup(name) != nil || name == "help" || name == "version" {
		return args
	}
	if picker.Flags().Lookup(name) == nil {
		return args
	}
	return append([]string{"serve", "picker"}, args...)
}

// oneLine folds a message onto one line.
func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}
