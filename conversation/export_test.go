package conversation

// HeldPrincipals returns how many principals hold a socket or an HTTP stream (entries of the
// per-principal count).
func (s *Server) HeldPrincipals() int {
	s.heldMu.Lock()
	defer s.heldMu.Unlock()
	return len(s.held)
}

// RunningTurns returns how many turns run; a turn leaves the count after its socket forgot
// it.
func (s *Server) RunningTurns() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.turns)
}
