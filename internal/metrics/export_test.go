package metrics

import "time"

// SetClock makes m read the time from now (tests of what ages).
func SetClock(m *Metrics, now func() time.Time) { m.agentTokens.now = now }

// AgentTokens is how many agent tokens m remembers.
func AgentTokens(m *Metrics) int64 { return m.agentTokens.size.Load() }
