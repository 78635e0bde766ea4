package protocol_test

import "github.com/wsgateway/wsgateway/internal/aguigen"

// The random sequences of TestConformance come from internal/aguigen; the
// shrinker edits them as ordered objects.
type (
	obj    = aguigen.Obj
	member = aguigen.Member
)

func generateCase(seed uint64, index int) confCase {
	c := aguigen.Generate(seed, index)
	return confCase{ID: c.ID, Events: c.Events, Upgrade: c.Upgrade}
}
