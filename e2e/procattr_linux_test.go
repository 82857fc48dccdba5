//go:build e2e && linux

package e2e

import "syscall"

// procAttr puts a child in its own process group and has the kernel kill
// it when the test binary dies without running its cleanups (go test's
// -timeout panics, say), instead of leaving it running and holding its
// port.
func procAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
}
