// Package bucket holds what the gateway's NATS KV buckets share: one value a key, on file,
// every key expiring a time after its last write.
package bucket

import (
	"errors"
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"
)

// Config returns the configuration of the bucket name: history 1, file storage, keys expiring
// ttl after their last write (0: never), on replicas nodes.
func Config(name string, ttl time.Duration, replicas int) natsjs.KeyValueConfig {
	return natsjs.KeyValueConfig{Bucket: name, History: 1, TTL: ttl, Storage: natsjs.FileStorage, Replicas: replicas}
}

// IsWrongLastSeq reports a refusal for a wrong expected last sequence (of a subject, or a
// key's revision), the refusal of a subject busy with another publish included: callers read
// again.
func IsWrongLastSeq(err error) bool {
	var apiErr *natsjs.APIError
	return errors.As(err, &apiErr) && (apiErr.ErrorCode == natsjs.JSErrCodeStreamWrongLastSequence ||
		apiErr.ErrorCode == natsjs.JSErrCodeStreamWrongLastSequenceConstant)
}
