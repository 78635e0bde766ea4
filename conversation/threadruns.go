package conversation

import (
	"bytes"
	"crypto/rand"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"time"

	"github.com/wsgateway/wsgateway/internal/quota"
	"github.com/wsgateway/wsgateway/metrics"
	"github.com/wsgateway/wsgateway/protocol"
)

// ThreadRunsHandler returns the handler of POST /api/threads/{threadId}/runs, the threadId
// in the request's path value threadId: it starts a turn of the principal's thread without a
// socket (a scheduler, a webhook), with a RunAgentInput body whose threadId, if present, must
// be the path's, and whose runId is minted ("run-" and 26 random characters) if absent. It
// answers once the run's log exists, 202 {"runId":R,"joinUrl":"<joinPath>?runId=R&offset=-1"}:
// the turn goes on into its log, which the join URL (a GET join of the HTTP transport, or a
// resume socket) and every follower of the thread read. The request is authenticated,
// checked and limited as a POST of the HTTP transport; refusals are JSON {"error":…}: 400
// (not JSON, an invalid RunAgentInput, another threadId), 401, 403 (an origin the socket
// would refuse, another principal's runId), 413, 429, 503 (shutting down, or the log cannot
// be created).
func (s *Server) ThreadRunsHandler(joinPath string) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		s.serveThreadRun(w, r, joinPath)
	})
}

func (s *Server) serveThreadRun(w http.ResponseWriter, r *http.Request, joinPath string) {
	principal, ok := s.admitJSON(w, r)
	if !ok {
		return
	}
	if !s.hold(principal) {
		s.cfg.Metrics.LimitRefused(metrics.LimitPrincipalSockets)
		quota.Pause(r.Context(), s.cfg.RefusalDelay)
		writeJSONError(w, http.StatusTooManyRequests, MsgTooManySockets)
		return
	}
	defer s.release(principal)
	body, ok := s.readBody(w, r)
	if !ok {
		return
	}
	in, msg := threadRunInput(body, r.PathValue("threadId"))
	if in == nil {
		writeJSONError(w, http.StatusBadRequest, msg)
		return
	}
	if !s.beginConn() {
		writeJSONError(w, http.StatusServiceUnavailable, "service restart")
		return
	}
	defer s.connWG.Done()
	sl, prev, err := s.turns.add(runKey{principal, in.RunID}, s.cfg.Store.ThreadKey(principal, in.ThreadID), nil, 0, 0)
	var refused *limitError
	if errors.As(err, &refused) {
		s.refuseStart(w, r, refused, true)
		return
	}
	if err != nil {
		writeJSONError(w, http.StatusServiceUnavailable, "service restart")
		return
	}
	log := s.log.With(slog.String(keyKind, "thread run"), slog.String(keyRemote, r.RemoteAddr))
	t, failure := s.startTurn(turnRequest{slot: sl, prev: prev, in: in, values: s.turnContext(r), sink: discard{}, log: log})
	if t == nil {
		ev, err := protocol.DecodeEvent(failure)
		switch {
		case sl.busyWith != "":
			writeThreadBusy(w, sl.busyWith)
		case err == nil && ev.Str("code") == CodeInvalidInput:
			writeJSONError(w, http.StatusBadRequest, ev.Str("message"))
		case err == nil && ev.Str("code") == CodeForbidden:
			writeJSONError(w, http.StatusForbidden, msgForbidden)
		case err == nil && ev.Str("code") == CodeLimitExceeded:
			w.Header().Set("Retry-After", "1")
			writeJSONError(w, http.StatusServiceUnavailable, ev.Str("message"))
		default:
			writeJSONError(w, http.StatusServiceUnavailable, "run log unavailable")
		}
		return
	}
	t.Detach()
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusAccepted)
	json.NewEncoder(w).Encode(struct {
		RunID   string `json:"runId"`
		JoinURL string `json:"joinUrl"`
	}{in.RunID, joinPath + "?" + url.Values{"runId": {in.RunID}, "offset": {"-1"}}.Encode()})
}

// readBody reads a JSON endpoint's request body, up to Config.ReadLimit bytes; it answers
// 413 or 400 itself and reports false when it cannot.
func (s *Server) readBody(w http.ResponseWriter, r *http.Request) ([]byte, bool) {
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, s.cfg.ReadLimit))
	if err != nil {
		var tooLarge *http.MaxBytesError
		if errors.As(err, &tooLarge) {
			writeJSONError(w, http.StatusRequestEntityTooLarge, "request body too large")
		} else {
			writeJSONError(w, http.StatusBadRequest, "reading the request body failed")
		}
		return nil, false
	}
	return body, true
}

// threadRunInput returns the RunAgentInput of a thread run's body, its threadId the path's
// and its runId minted if absent, or nil and why it is refused.
func threadRunInput(body []byte, threadID string) (*protocol.RunAgentInput, string) {
	var fields map[string]json.RawMessage
	d := json.NewDecoder(bytes.NewReader(body))
	if err := d.Decode(&fields); err != nil || fields == nil {
		return nil, "the request body is not a JSON object: a RunAgentInput is expected"
	}
	if raw, ok := fields["threadId"]; ok {
		var id string
		if json.Unmarshal(raw, &id) != nil || id != threadID {
			return nil, "the body's threadId differs from the path's"
		}
	}
	fields["threadId"], _ = json.Marshal(threadID)
	if raw, ok := fields["runId"]; !ok || string(raw) == `""` || string(raw) == "null" {
		fields["runId"], _ = json.Marshal("run-" + rand.Text())
	}
	b, _ := json.Marshal(fields)
	in, err := protocol.DecodeRunAgentInput(b)
	if err != nil {
		return nil, err.Error()
	}
	return in, ""
}

// discard is the sink of a turn that no client started: it goes into its log only.
type discard struct{}

func (discard) Deliver(string, []byte, time.Time) {}
