package conversation

import (
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"time"

	"github.com/wsgateway/wsgateway/usage"
)

// UsageHandler returns the handler of GET /api/usage?from=&to= (THREADS.md section 3): the
// caller's principal's token usage over the whole periods of the ledger that cover [from,
// to) (RFC 3339 times; defaults: the current period), its totals and its breakdown by thread
// and by model, read from the ledger's aggregates (Config.Usage). A bad time or range is
// answered 400 {"error":…}; without a ledger, 404.
func (s *Server) UsageHandler() http.Handler { return http.HandlerFunc(s.serveUsage) }

func (s *Server) serveUsage(w http.ResponseWriter, r *http.Request) {
	principal, ok := s.admitJSON(w, r)
	if !ok {
		return
	}
	if s.cfg.Usage == nil {
		writeJSONError(w, http.StatusNotFound, "no usage ledger")
		return
	}
	q := r.URL.Query()
	var times [2]time.Time
	for i, name := range []string{"from", "to"} {
		if len(q[name]) > 1 {
			writeJSONError(w, http.StatusBadRequest, name+": given more than once")
			return
		}
		v := q.Get(name)
		if v == "" {
			continue
		}
		t, err := time.Parse(time.RFC3339Nano, v)
		if err != nil {
			writeJSONError(w, http.StatusBadRequest, name+": not an RFC 3339 time (such as 2026-12-01T00:00:00Z): "+v)
			return
		}
		times[i] = t
	}
	rep, err := s.cfg.Usage.Report(r.Context(), principal, times[0], times[1])
	switch {
	case errors.Is(err, usage.ErrRange):
		writeJSONError(w, http.StatusBadRequest, err.Error())
	case err != nil:
		s.log.Warn("usage report", slog.String(keyErr, err.Error()))
		writeJSONError(w, http.StatusServiceUnavailable, "usage ledger unavailable")
	default:
		w.Header().Set("Content-Type", "application/json")
		w.Header().Set("Cache-Control", "no-store")
		json.NewEncoder(w).Encode(rep)
	}
}
