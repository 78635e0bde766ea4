package conversation

import (
	"math"
	"net/http"
	"strconv"
	"time"

	"github.com/wsgateway/wsgateway/internal/quota"
	"github.com/wsgateway/wsgateway/metrics"
)

// PrincipalLimits are the per-principal bounds of Config, for one principal
// (Config.PrincipalLimits): a zero field keeps the Config's.
type PrincipalLimits struct {
	Sockets   int     // Config.MaxSocketsPerPrincipal
	Turns     int     // Config.MaxTurnsPerPrincipal
	TurnRate  float64 // Config.TurnStartRate
	TurnBurst int     // Config.TurnStartBurst
	Hydrates  int     // Config.MaxHydratesPerPrincipal
}

// Messages of the refusals of the per-principal bounds: the bare RUN_ERROR (code
// limit_exceeded) of a run frame, the body of a 429. Each names its flag.
const (
	MsgPrincipalTurns    = "max-principal-turns: too many turns running for this principal"
	MsgPrincipalTurnRate = "principal-turn-rate: too many turn starts per second for this principal"
	MsgTooManyHydrates   = "max-principal-hydrates: too many hydrates at once for this principal"
	// MsgTooManyThreads ends (RUN_ERROR code limit_exceeded, after run.accepted) a run that
	// would start a thread beyond the principal's.
	MsgTooManyThreads = "max-threads-per-principal: this principal has as many threads as it may; delete one to start another"
)

// limits returns principal's bounds: the Config's, with its entry of Config.PrincipalLimits.
func (s *Server) limits(principal string) PrincipalLimits {
	l := PrincipalLimits{
		Sockets:   s.cfg.MaxSocketsPerPrincipal,
		Turns:     s.cfg.MaxTurnsPerPrincipal,
		TurnRate:  s.cfg.TurnStartRate,
		TurnBurst: s.cfg.TurnStartBurst,
		Hydrates:  s.cfg.MaxHydratesPerPrincipal,
	}
	o, ok := s.cfg.PrincipalLimits[principal]
	if !ok {
		return l
	}
	pick := func(v *int, o int) {
		if o != 0 {
			*v = o
		}
	}
	pick(&l.Sockets, o.Sockets)
	pick(&l.Turns, o.Turns)
	pick(&l.TurnBurst, o.TurnBurst)
	pick(&l.Hydrates, o.Hydrates)
	if o.TurnRate != 0 {
		l.TurnRate = o.TurnRate
	}
	return l
}

// limitError is a start refused by a limit of its socket or principal: the label of its
// refusal's metric, the message of its answer, which names the limit's flag, and for a rate,
// how long until a start fits again.
type limitError struct {
	limit      metrics.Limit
	msg        string
	retryAfter time.Duration
}

func (e *limitError) Error() string { return e.msg }

// Is matches a refusal by the same limit.
func (e *limitError) Is(target error) bool {
	t, ok := target.(*limitError)
	return ok && t.limit == e.limit
}

// Refusals of registry.add.
var (
	errTooManyTurns   = &limitError{limit: metrics.LimitSocketTurns, msg: MsgTooManyTurns}
	errPrincipalTurns = &limitError{limit: metrics.LimitPrincipalTurns, msg: MsgPrincipalTurns}
	errTurnRate       = &limitError{limit: metrics.LimitPrincipalTurnRate, msg: MsgPrincipalTurnRate}
)

// refuseStart counts the refusal of r, an HTTP turn start, by limit e and answers it 429
// after Config.RefusalDelay, as JSON ({"error":…}) when asJSON, else as text; a refusal for a
// rate says in Retry-After the seconds until a start fits again (rounded up).
func (s *Server) refuseStart(w http.ResponseWriter, r *http.Request, e *limitError, asJSON bool) {
	s.cfg.Metrics.LimitRefused(e.limit)
	quota.Pause(r.Context(), s.cfg.RefusalDelay)
	if e.retryAfter > 0 {
		w.Header().Set("Retry-After", strconv.Itoa(int(math.Ceil(e.retryAfter.Seconds()))))
	}
	if asJSON {
		writeJSONError(w, http.StatusTooManyRequests, e.msg)
		return
	}
	http.Error(w, e.msg, http.StatusTooManyRequests)
}

// holdHydrate takes one of principal's hydrates (Config.MaxHydratesPerPrincipal), or
// answers r 429 after Config.RefusalDelay and reports false. A hydrate takes it before it
// reads anything; Put releases it.
func (s *Server) holdHydrate(w http.ResponseWriter, r *http.Request, principal string) bool {
	if s.hydrates.Take(principal, s.limits(principal).Hydrates) {
		return true
	}
	s.cfg.Metrics.LimitRefused(metrics.LimitPrincipalHydrates)
	quota.Pause(r.Context(), s.cfg.RefusalDelay)
	writeJSONError(w, http.StatusTooManyRequests, MsgTooManyHydrates)
	return false
}
