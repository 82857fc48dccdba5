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
)

func main() {
	os.Exit(run(os.Args[1:], os.Stdout, os.Stderr))
}

// run executes the command line args and returns the exit status.
func run(args []string, stdout, stderr io.Writer) int {
	root := rootCmd
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

// oneLine folds a message onto one line.
func oneLine(s string) string {
	return strings.Join(strings.Fields(s), " ")
}
