package jetstream

import (
	"crypto/sha256"
	"encoding/base32"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"

	"github.com/wsgateway/wsgateway/jetstream/lease"
)

// KeyEncoding spells hashes with characters valid in subjects and KV keys.
// KeyEncoding encodes the hashes that name runs, threads and their keys: lower-case base32,
// valid in a NATS subject and a KV key.
var KeyEncoding = base32.NewEncoding("abcdefghijklmnopqrstuvwxyz234567").WithPadding(base32.NoPadding)

// runKey names a run's metadata and lease. It depends on the runId only: runIds are one
// namespace across principals, so a second principal's Create can be refused.
func runKey(runID string) string {
	h := sha256.New()
	h.Write([]byte("run\x00"))
	h.Write([]byte(runID))
	return KeyEncoding.EncodeToString(h.Sum(nil))
}

// liveKey names a store's liveness key in the lease bucket. Its "live." prefix tells it from
// run keys, which have no dot.
func liveKey(owner string) string {
	h := sha256.Sum256([]byte("live\x00" + owner))
	return lease.LivePrefix + KeyEncoding.EncodeToString(h[:])
}

// logKey names a run's subject.
func logKey(principal, runID string) string { return PairKey("log", principal, runID) }

// PairKey hashes (principal, id) in the domain kind. It is injective in the pair up to SHA-256
// collisions: the principal is length-delimited, so no two pairs hash the same input, and any
// bytes of either map to 52 subject-safe characters.
func PairKey(kind, principal, id string) string {
	h := sha256.New()
	var n [binary.MaxVarintLen64]byte
	h.Write([]byte(kind + "\x00"))
	h.Write(n[:binary.PutUvarint(n[:], uint64(len(principal)))])
	h.Write([]byte(principal))
	h.Write([]byte(id))
	return KeyEncoding.EncodeToString(h.Sum(nil))
}

// offsetTag binds offsets to one run of one stream epoch: an offset of another run, or of a
// stream that was recreated since, carries another tag.
func offsetTag(epoch, logKey string) string {
	h := sha256.Sum256([]byte(epoch + "\x00" + logKey))
	return hex.EncodeToString(h[:6])
}

// position is a decoded offset: the event at index idx of the batch message seq, in run
// generation gen.
type position struct {
	gen uint64
	seq uint64
	idx int
	tag string
}

const (
	genWidth = 6
	seqWidth = 12
	idxWidth = 4
	tagWidth = 12
	// offsetLen is the length of every offset: four fixed-width lower-case hex fields joined
	// by '-', so offsets of one generation compare as strings in log order.
	offsetLen = genWidth + seqWidth + idxWidth + tagWidth + 3
	// maxBatchEvents is the most events one batch message holds (idx has four hex digits).
	maxBatchEvents = 1 << 16
)

// String formats p as an offset. A field too wide for its width (which the writer never
// produces) is formatted at full width by fmt, so the result has the wrong length and
// parseOffset refuses it: an over-wide position never formats as another valid offset.
func (p position) String() string {
	return string(p.append(make([]byte, 0, offsetLen)))
}

// append appends p formatted as an offset (String) to b.
func (p position) append(b []byte) []byte {
	if p.gen>>(4*genWidth) != 0 || p.seq>>(4*seqWidth) != 0 || p.idx < 0 || p.idx >= 1<<(4*idxWidth) ||
		len(p.tag) != tagWidth {
		return fmt.Appendf(b, "%0*x-%0*x-%0*x-%s", genWidth, p.gen, seqWidth, p.seq, idxWidth, p.idx, p.tag)
	}
	at := len(b)
	b = append(b, make([]byte, offsetLen)...)
	at = putHex(b, at, genWidth, p.gen)
	at = putHex(b, at, seqWidth, p.seq)
	at = putHex(b, at, idxWidth, uint64(p.idx))
	copy(b[at:], p.tag)
	return b
}

// putHex writes v as width lower-case hex digits at b[at:] followed by '-', and returns the
// index after the '-'. v must fit in width digits.
func putHex(b []byte, at, width int, v uint64) int {
	const digits = "0123456789abcdef"
	for i := at + width - 1; i >= at; i-- {
		b[i] = digits[v&0xf]
		v >>= 4
	}
	b[at+width] = '-'
	return at + width + 1
}

// parseOffset decodes an offset minted by position.String. It checks the form only.
func parseOffset(s string) (position, error) {
	if len(s) != offsetLen {
		return position{}, ErrInvalidOffset
	}
	fields := [4]string{}
	widths := [4]int{genWidth, seqWidth, idxWidth, tagWidth}
	at := 0
	for i, w := range widths {
		if i > 0 {
			if s[at] != '-' {
				return position{}, ErrInvalidOffset
			}
			at++
		}
		fields[i] = s[at : at+w]
		at += w
		for j := 0; j < len(fields[i]); j++ {
			c := fields[i][j]
			if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
				return position{}, ErrInvalidOffset
			}
		}
	}
	gen, err1 := strconv.ParseUint(fields[0], 16, 64)
	seq, err2 := strconv.ParseUint(fields[1], 16, 64)
	idx, err3 := strconv.ParseUint(fields[2], 16, 64)
	if err := errors.Join(err1, err2, err3); err != nil || gen == 0 || seq == 0 {
		return position{}, ErrInvalidOffset
	}
	return position{gen: gen, seq: seq, idx: int(idx), tag: fields[3]}, nil
}

// encodeBatch appends events to dst as a batch message body: each event as a uvarint length
// followed by its bytes.
func encodeBatch(dst []byte, events [][]byte) []byte {
	for _, e := range events {
		dst = binary.AppendUvarint(dst, uint64(len(e)))
		dst = append(dst, e...)
	}
	return dst
}

// errBadBatch reports a batch body that encodeBatch did not write.
var errBadBatch = errors.New("jetstream: malformed batch message")

// decodeBatch splits a batch body into its events; they alias body.
func decodeBatch(body []byte) ([][]byte, error) {
	var events [][]byte
	for len(body) > 0 {
		n, k := binary.Uvarint(body)
		if k <= 0 || n > uint64(len(body)-k) {
			return nil, errBadBatch
		}
		events = append(events, body[k:k+int(n)])
		body = body[k+int(n):]
		if len(events) > maxBatchEvents {
			return nil, errBadBatch
		}
	}
	return events, nil
}
