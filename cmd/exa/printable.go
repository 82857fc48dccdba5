package main

import (
	"strconv"
	"strings"
	"unicode"
	"unicode/utf8"
)

// printable returns s unchanged when every character of it is printable
// (unicode.IsPrint: no control, format or invalid characters), and s
// quoted as a Go string otherwise, so that text from the network or a
// hand-edited file cannot move the cursor, recolour or retitle the
// terminal it is printed to.
func printable(s string) string {
	if utf8.ValidString(s) && strings.IndexFunc(s, func(r rune) bool { return !unicode.IsPrint(r) }) < 0 {
		return s
	}
	return strconv.Quote(s)
}
