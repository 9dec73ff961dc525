package sweeper

// Passes reports how many passes s has completed.
func (s *Sweeper) Passes() int64 { return s.passes.Load() }
