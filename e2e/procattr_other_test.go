//go:build e2e && !linux

package e2e

import "syscall"

// procAttr puts a child in its own process group (no parent-death signal
// outside Linux: a test binary that dies without its cleanups leaves it).
func procAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true}
}
