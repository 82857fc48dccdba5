//go:build !race

package sseagg

const raceEnabled = false
