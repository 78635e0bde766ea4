package protocol

import (
	"unicode"
	"unicode/utf8"
)

// MaxRunIDLen is the longest runId the gateway accepts, in bytes.
const MaxRunIDLen = 512

// ValidRunID reports whether s may name a run: non-empty printable UTF-8 of at most
// MaxRunIDLen bytes. Run frames and resume parameters are held to the same rule, so that
// every run that starts can be resumed.
func ValidRunID(s string) bool {
	if s == "" || len(s) > MaxRunIDLen || !utf8.ValidString(s) {
		return false
	}
	for _, r := range s {
		if !unicode.IsPrint(r) {
			return false
		}
	}
	return true
}
