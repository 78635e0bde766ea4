package conversation

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
)

// BranchHandler returns the handler of POST /api/threads/{threadId}/branch
// {"messageId":M} (THREADS.md section 7), the threadId in the request's path value threadId:
// it makes the branch that holds M the thread's active one, to its leaf, for every device,
// tells the thread's followers (a thread.branch frame), and answers the thread's new first
// page as a hydrate does (?limit= as there). Refusals are JSON {"error":…}: 400 (not JSON, no
// messageId), 401, 403, 404 (an unknown thread or message), 409 {"error":"thread_busy",
// "activeRun":{"runId":R}} while a run of the thread is active or queued, 413, 503.
func (srv *Server) BranchHandler() http.Handler { return http.HandlerFunc(srv.serveBranch) }

func (srv *Server) serveBranch(w http.ResponseWriter, r *http.Request) {
	principal, ok := srv.admitThreads(w, r)
	if !ok {
		return
	}
	body, ok := srv.readBody(w, r)
	if !ok {
		return
	}
	var req struct {
		MessageID string `json:"messageId"`
	}
	if json.Unmarshal(body, &req) != nil || req.MessageID == "" {
		writeJSONError(w, http.StatusBadRequest, `the body must be {"messageId":"<id of a message of the branch to show>"}`)
		return
	}
	threadID := r.PathValue("threadId")
	ctx, cancel := context.WithTimeout(r.Context(), threadTimeout)
	defer cancel()
	t, err := srv.cfg.Threads.SwitchBranch(ctx, principal, threadID, req.MessageID)
	var busy *BusyError
	for range 4 {
		// A run whose terminal is stored and whose finish has not reached the thread yet
		// (its gateway is writing it, or stopped): finished here, as a hydrate does.
		if !errors.As(err, &busy) || !srv.finishEnded(ctx, principal, threadID, busy.ActiveRun) {
			break
		}
		t, err = srv.cfg.Threads.SwitchBranch(ctx, principal, threadID, req.MessageID)
	}
	switch {
	case errors.As(err, &busy):
		writeThreadBusy(w, busy.ActiveRun)
		return
	case errors.Is(err, ErrUnknownThread):
		writeJSONError(w, http.StatusNotFound, "unknown thread")
		return
	case errors.Is(err, ErrUnknownMessage):
		writeJSONError(w, http.StatusNotFound, "unknown message")
		return
	case err != nil:
		srv.log.Warn("switching a thread's branch", slog.String(keyErr, err.Error()))
		writeJSONError(w, http.StatusServiceUnavailable, "thread store unavailable")
		return
	}
	ans, release := srv.hydrateAnswer(ctx, principal, threadID, t, pageLimit(r), "")
	defer release()
	writeJSON(w, http.StatusOK, ans)
}

// finishEnded finishes the thread of the principal's run runID if its log holds its end,
// and reports whether it did.
func (srv *Server) finishEnded(ctx context.Context, principal, threadID, runID string) bool {
	entries, closed, err := srv.cfg.Store.Snapshot(ctx, principal, runID)
	defer srv.charge(entries)()
	if err != nil || !logEnded(entries, closed) {
		return false
	}
	if err := srv.cfg.Threads.FinishRun(ctx, principal, threadID, runID, eventsOf(entries)); err != nil {
		srv.log.Warn("finishing an ended run", slog.String(keyRunID, runID), slog.String(keyErr, err.Error()))
		return false
	}
	return true
}
