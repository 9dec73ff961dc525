package metrics

import (
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/registryd/registryd/internal/registry"
)

// agentTokenWindow is how long a token stays in the agent-token figures
// after its last use: an agent heartbeats every few seconds, so one that
// renewed its token stops showing the old one within this time, and a
// host that went away drops out.
const agentTokenWindow = 10 * time.Minute

var (
	agentTokenExpiry = desc("agent_token_expiry_timestamp_seconds",
		"The earliest expiry (Unix time) among the agent tokens of each subject used on this replica in the last 10 minutes. Renewing agents keep it at least a third of a token lifetime ahead.", "sub")
	agentTokenLeft = desc("agent_token_life_left_ratio",
		"The least share of its lifetime left (0 to 1) among the agent tokens of each subject used on this replica in the last 10 minutes. Agents renew at a third; below 0.2 some agent of the subject is not renewing.", "sub")
)

// agentTokens remembers the agent tokens in use, one entry per token. A
// renewed token stops being used, so it drops out of the window; the
// agents of a DaemonSet share one lineage but not their renewals, so an
// agent that stops renewing shows even among many that renew.
type agentTokens struct {
	now     func() time.Time
	entries sync.Map     // token key → *tokenSeen
	size    atomic.Int64 // entries, about
	pruned  atomic.Int64 // when stale entries were last dropped (Unix seconds)
}

// maxAgentTokens bounds the entries: a fleet's agents hold one token each
// (two for a moment when one renews), and nothing a token holder does
// grows memory past this.
const maxAgentTokens = 200_000

type tokenSeen struct {
	sub             string
	issued, expires time.Time
	seen            atomic.Int64 // Unix seconds of the last use
}

// seen records a use of an agent token of sub at now. Most calls only
// read: an entry is made on a token's first use, and its time of use
// written at most once a second.
func (a *agentTokens) seen(sub string, t registry.TokenInfo, now time.Time) {
	if t.Expires.IsZero() {
		return
	}
	key := t.ID
	if key == "" { // no "jti" (another issuer's token): its subject and expiry
		key = sub + "\x00" + strconv.FormatInt(t.Expires.UnixNano(), 10)
	}
	sec := now.Unix()
	if v, ok := a.entries.Load(key); ok {
		if e := v.(*tokenSeen); e.seen.Load() != sec {
			e.seen.Store(sec)
		}
		return
	}
	// Stale entries go at most once a minute, scraped or not.
	if last := a.pruned.Load(); sec-last >= 60 && a.pruned.CompareAndSwap(last, sec) {
		a.prune(now)
	}
	if a.size.Load() >= maxAgentTokens {
		return
	}
	e := &tokenSeen{sub: sub, issued: t.Issued, expires: t.Expires}
	e.seen.Store(sec)
	if _, loaded := a.entries.LoadOrStore(key, e); !loaded {
		a.size.Add(1)
	}
}

// prune drops the entries unused for agentTokenWindow or expired.
func (a *agentTokens) prune(now time.Time) {
	a.entries.Range(func(k, v any) bool {
		if a.stale(v.(*tokenSeen), now) && a.entries.CompareAndDelete(k, v) {
			a.size.Add(-1)
		}
		return true
	})
}

func (a *agentTokens) stale(e *tokenSeen, now time.Time) bool {
	return now.Sub(time.Unix(e.seen.Load(), 0)) > agentTokenWindow || !now.Before(e.expires)
}

func (a *agentTokens) Describe(ch chan<- *prometheus.Desc) {
	ch <- agentTokenExpiry
	ch <- agentTokenLeft
}

func (a *agentTokens) Collect(ch chan<- prometheus.Metric) {
	now := a.now()
	type least struct {
		expires time.Time
		left    float64
	}
	bySub := map[string]*least{}
	a.prune(now)
	a.entries.Range(func(k, v any) bool {
		e := v.(*tokenSeen)
		if a.stale(e, now) {
			return true
		}
		left := 1.0
		if life := e.expires.Sub(e.issued); !e.issued.IsZero() && life > 0 {
			left = min(1, float64(e.expires.Sub(now))/float64(life))
		}
		l := bySub[e.sub]
		if l == nil {
			bySub[e.sub] = &least{expires: e.expires, left: left}
			return true
		}
		if e.expires.Before(l.expires) {
			l.expires = e.expires
		}
		l.left = min(l.left, left)
		return true
	})
	for sub, l := range bySub {
		ch <- prometheus.MustNewConstMetric(agentTokenExpiry, prometheus.GaugeValue, float64(l.expires.Unix()), sub)
		ch <- prometheus.MustNewConstMetric(agentTokenLeft, prometheus.GaugeValue, l.left, sub)
	}
}

// AgentTokenSeen records that an agent of sub used token t.
func (m *Metrics) AgentTokenSeen(sub string, t registry.TokenInfo) {
	m.agentTokens.seen(sub, t, m.agentTokens.now())
}

// TokenRenewed counts a renewal: result is "renewed", "refused" or
// "error".
func (m *Metrics) TokenRenewed(result string) { m.tokenRenewals.WithLabelValues(result).Inc() }
