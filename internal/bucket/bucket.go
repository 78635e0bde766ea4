// Package bucket holds what the gateway's NATS KV buckets share: one value a key, on file,
// every key expiring a time after its last write.
package bucket

import (
	"time"

	natsjs "github.com/nats-io/nats.go/jetstream"
)

// Config returns the configuration of the bucket name: history 1, file storage, keys expiring
// ttl after their last write (0: never), on replicas nodes.
func Config(name string, ttl time.Duration, replicas int) natsjs.KeyValueConfig {
	return natsjs.KeyValueConfig{Bucket: name, History: 1, TTL: ttl, Storage: natsjs.FileStorage, Replicas: replicas}
}
