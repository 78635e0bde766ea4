package conversation

// HeldPrincipals returns how many principals hold a socket or an HTTP stream (entries of the
// per-principal count).
func (s *Server) HeldPrincipals() int { return s.sockets.Len() }

// RunningTurns returns how many turns run or start; a turn leaves the count once it ended.
func (s *Server) RunningTurns() int {
	s.turns.mu.Lock()
	defer s.turns.mu.Unlock()
	return len(s.turns.slots)
}

// AbortRequested reports whether the registry holds the principal's turn of runID with an
// abort requested.
func (s *Server) AbortRequested(principal, runID string) bool {
	s.turns.mu.Lock()
	defer s.turns.mu.Unlock()
	sl := s.turns.slots[runKey{principal, runID}]
	return sl != nil && sl.aborted
}

// ParkedReaders returns how many sockets' readers are parked in the poller (poller_linux.go).
var ParkedReaders = parkedReaders
