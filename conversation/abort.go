package conversation

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"time"

	"github.com/wsgateway/wsgateway/protocol"
	"github.com/wsgateway/wsgateway/turn"
)

// Outcomes of an abort request (AbortHandler): how the run's log ended.
const (
	AbortOutcomeAborted  = "aborted"  // RUN_ERROR code aborted
	AbortOutcomeFinished = "finished" // RUN_FINISHED
	AbortOutcomeError    = "error"    // another RUN_ERROR (the agent failed, the producer was lost, …)
)

// Bounds of an abort request: how long it waits for the run's log to close, and how often
// it repeats its request to the other gateways meanwhile (a request is delivered at most
// once).
const (
	abortWait   = 30 * time.Second
	abortRepeat = time.Second
)

// AbortHandler returns the handler of POST /api/runs/{runId}/abort (THREADS.md section 3),
// the runId in the request's path value runId: it stops the principal's run wherever it
// runs and answers once the run's log is closed, 200 {"runId":R,"outcome":"aborted",
// "finished" or "error"}; a run that ended already answers its outcome. An unknown run, or
// another principal's, is answered 404 {"error":"unknown or expired run"} and left alone.
// DELETE ?runId= on the HTTP transports answers the same.
func (s *Server) AbortHandler() http.Handler { return http.HandlerFunc(s.serveAbort) }

func (s *Server) serveAbort(w http.ResponseWriter, r *http.Request) {
	if principal, ok := s.admitJSON(w, r); ok {
		s.answerAbort(w, r, principal, r.PathValue("runId"))
	}
}

// admitJSON returns the principal of a request to a JSON endpoint whose origin is allowed,
// or answers 401 or 403 and false.
func (s *Server) admitJSON(w http.ResponseWriter, r *http.Request) (string, bool) {
	principal, _, err := s.identify(r)
	if err != nil {
		writeJSONError(w, http.StatusUnauthorized, "unauthorized")
		return "", false
	}
	if !s.originAllowed(r) {
		writeJSONError(w, http.StatusForbidden, "origin not allowed")
		return "", false
	}
	return principal, true
}

// answerAbort stops the principal's run of runID and answers its outcome (AbortHandler).
func (s *Server) answerAbort(w http.ResponseWriter, r *http.Request, principal, runID string) {
	if !protocol.ValidRunID(runID) {
		writeJSONError(w, http.StatusBadRequest, "invalid runId")
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), abortWait)
	defer cancel()
	outcome, err := s.abortRun(ctx, principal, runID)
	switch {
	case errors.Is(err, ErrUnknownRun), errors.Is(err, ErrForbidden):
		writeJSONError(w, http.StatusNotFound, "unknown or expired run")
	case errors.Is(err, context.DeadlineExceeded):
		writeJSONError(w, http.StatusGatewayTimeout, "the run did not end in time")
	case err != nil:
		s.log.Warn("abort request", slog.String(keyRunID, runID), slog.String(keyErr, err.Error()))
		writeJSONError(w, http.StatusServiceUnavailable, "run log unavailable")
	default:
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(struct {
			RunID   string `json:"runId"`
			Outcome string `json:"outcome"`
		}{runID, outcome})
	}
}

// abortRun stops the principal's run of runID, here or on another gateway, and returns its
// outcome once its log is closed, from the log's last event (Store.LastEvent: what is stored
// after the request and one batch, however long the run was), which a run still being
// created here, or aborted as it starts, has soon (LastEvent waits for it). A turn of this
// gateway has also ended and freed its place (Config.MaxTurnsPerPrincipal) by then: a client
// that stopped a turn may start the next one at once.
func (s *Server) abortRun(ctx context.Context, principal, runID string) (string, error) {
	here := s.turns.abort(runKey{principal, runID}, nil, "", 0, 0)
	if here == nil {
		stop := make(chan struct{})
		defer close(stop)
		go s.requestAbort(principal, runID, stop)
	}
	last, err := s.cfg.Store.LastEvent(ctx, principal, runID)
	if err != nil {
		return "", err
	}
	if here != nil {
		err = s.turns.wait(ctx, here)
	}
	return outcomeOf(last), err
}

// requestAbort asks the other gateways to abort the principal's turn of runID, again every
// abortRepeat until stop is closed.
func (s *Server) requestAbort(principal, runID string, stop <-chan struct{}) {
	t := time.NewTicker(abortRepeat)
	defer t.Stop()
	for {
		if err := s.cfg.Store.RequestAbort(principal, runID, ""); err != nil {
			s.log.Warn("abort request to the other gateways", slog.String(keyRunID, runID), slog.String(keyErr, err.Error()))
		}
		select {
		case <-stop:
			return
		case <-t.C:
		}
	}
}

// outcomeOf names how a log whose last event is last ended.
func outcomeOf(last []byte) string {
	end, ok := protocol.EndOf(last)
	switch {
	case !ok:
		return AbortOutcomeError
	case end.Kind == protocol.EndFinished, end.Kind == protocol.EndInterrupted:
		return AbortOutcomeFinished
	case end.Code == turn.CodeAborted:
		return AbortOutcomeAborted
	}
	return AbortOutcomeError
}

// writeJSONError answers status with the body {"error":msg}.
func writeJSONError(w http.ResponseWriter, status int, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	json.NewEncoder(w).Encode(struct {
		Error string `json:"error"`
	}{msg})
}

// writeThreadBusy answers a run refused because activeRun is active on its thread
// (multitaskStrategy reject): 409 {"error":"thread_busy","activeRun":{"runId":R}}.
func writeThreadBusy(w http.ResponseWriter, activeRun string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusConflict)
	json.NewEncoder(w).Encode(struct {
		Error     string `json:"error"`
		ActiveRun struct {
			RunID string `json:"runId"`
		} `json:"activeRun"`
	}{Error: CodeThreadBusy, ActiveRun: struct {
		RunID string `json:"runId"`
	}{activeRun}})
}
