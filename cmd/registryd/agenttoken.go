package main

import (
	"context"
	"encoding/base64"
	"encoding/json"
	"errors"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/registryd/registryd/client"
	"github.com/registryd/registryd/internal/agent"
	"github.com/registryd/registryd/internal/auth"
	"github.com/registryd/registryd/internal/lifecycle"
	"github.com/registryd/registryd/internal/registry"
)

// tokenWarnBefore is how long before a token that is not renewed expires
// the agent starts warning about it, once a day.
const tokenWarnBefore = 7 * 24 * time.Hour

// tokenKeeper holds the agent's token: the one configured
// (REGISTRY_TOKEN, or REGISTRY_TOKEN_FILE read again on every request), or
// the latest renewal of it, which it keeps next to the agent's state so
// that a restart goes on with it. It renews the token when a third of its
// lifetime is left (POST /v1/tokens/renew), so the agent outlives every
// token lifetime without a human.
//
// A configured token that changes (a rotated Secret or file) replaces
// what the keeper holds, unless what it holds is a renewal of it.
type tokenKeeper struct {
	configured client.TokenSource
	path       string // where the latest renewal is kept
	log        *slog.Logger
	now        func() time.Time
	check      time.Duration // the longest wait between checks; 1m when zero

	// fileMu orders the writes and removals of the kept renewal, so a
	// refused renewal is never written back after its removal.
	fileMu   sync.Mutex
	mu       sync.Mutex
	cur      string    // the token in use
	info     tokenInfo // what cur says of itself
	lastConf string    // the configured token last seen
	confInfo tokenInfo // what lastConf says of itself
	// refused is the lineage the server last refused to renew, and
	// retryAt when to ask again (the refusal may have been one replica's).
	refused string
	retryAt time.Time
	warned  time.Time // when the last expiry warning was logged
	// skew is the server's clock minus this host's, as the last renewal's
	// iat showed it: renewals are timed by the server's clock.
	skew time.Duration
}

// tokenInfo is what the agent reads of its token: it cannot verify the
// signature (the server holds the key) and needs not.
type tokenInfo struct {
	ID      string    `json:"jti"`
	Lineage string    `json:"lid"`
	Role    string    `json:"role"`
	IPs     *[]string `json:"ips"`
	Issued  jsonTime  `json:"iat"`
	Expires jsonTime  `json:"exp"`
}

// lineage names the token minted by hand the token descends from.
func (i tokenInfo) lineage() string {
	if i.Lineage != "" {
		return i.Lineage
	}
	return i.ID
}

// renewable is what the server requires of a token it renews.
func (i tokenInfo) renewable() bool {
	return i.Role == string(registry.RoleAgent) && i.IPs != nil && i.ID != "" && !i.Issued.IsZero()
}

// jsonTime is a JWT NumericDate (seconds since 1970, perhaps fractional).
type jsonTime struct{ time.Time }

func (t *jsonTime) UnmarshalJSON(b []byte) error {
	var f float64
	if err := json.Unmarshal(b, &f); err != nil {
		return err
	}
	t.Time = time.Unix(0, int64(f*1e9))
	return nil
}

// readTokenInfo reads a JWT's claims without verifying it.
func readTokenInfo(tok string) (tokenInfo, error) {
	parts := strings.Split(tok, ".")
	if len(parts) != 3 {
		return tokenInfo{}, errors.New("not a JWT")
	}
	b, err := base64.RawURLEncoding.DecodeString(parts[1])
	if err != nil {
		return tokenInfo{}, errors.New("not a JWT")
	}
	var i tokenInfo
	if err := json.Unmarshal(b, &i); err != nil || i.Expires.IsZero() {
		return tokenInfo{}, errors.New("not a JWT with an exp")
	}
	return i, nil
}

// renewalPath is where the keeper of an agent with state file state keeps
// its renewed token: beside it, owner-only.
func renewalPath(state string) string {
	return strings.TrimSuffix(state, filepath.Ext(state)) + ".token"
}

func newTokenKeeper(configured client.TokenSource, state string, log *slog.Logger) *tokenKeeper {
	k := &tokenKeeper{configured: configured, path: renewalPath(state), log: log, now: time.Now}
	if b, err := os.ReadFile(k.path); err == nil {
		tok := strings.TrimSpace(string(b))
		if i, err := readTokenInfo(tok); err == nil && k.now().Before(i.Expires.Time) {
			k.cur, k.info = tok, i
		}
	}
	return k
}

// Token is the client's TokenSource: the token to send now. The
// configured token is read under the lock, so that reads racing a
// rotation cannot take an older one up after a newer.
func (k *tokenKeeper) Token(ctx context.Context) (string, error) {
	k.mu.Lock()
	defer k.mu.Unlock()
	conf, err := k.configured(ctx)
	if err != nil {
		if k.cur != "" {
			return k.cur, nil // a file briefly missing mid-rotation
		}
		return "", err
	}
	if conf != k.lastConf {
		k.lastConf = conf
		k.confInfo, _ = readTokenInfo(conf)
		k.adopt(conf)
	}
	return k.cur, nil
}

// adopt takes up conf, a configured token seen for the first time, unless
// the token held is a later renewal of it.
func (k *tokenKeeper) adopt(conf string) {
	ci := k.confInfo
	if k.cur != "" && !ci.Expires.IsZero() && k.info.lineage() == ci.lineage() && k.info.Expires.After(ci.Expires.Time) {
		return
	}
	if k.cur != "" && k.cur != conf {
		k.log.Info("agent token: using the configured token", "expires", fmtTime(ci.Expires.Time))
	}
	k.cur, k.info = conf, ci
	k.warned = time.Time{}
}

// Refused is told that the server refused token (401). A renewal the
// server refuses (revoked by its own id, or signed with a secret since
// rotated) gives way to the configured token, and is forgotten, when the
// configured token is still valid; otherwise the renewal is all the agent
// has (a refusal may be one replica's), and it stays.
func (k *tokenKeeper) Refused(token string) {
	k.mu.Lock()
	if token != k.cur || token == k.lastConf || k.lastConf == "" {
		k.mu.Unlock()
		return
	}
	if k.confInfo.Expires.IsZero() || !k.now().Add(k.skew).Before(k.confInfo.Expires.Time) {
		k.mu.Unlock()
		k.log.Warn("agent token: the registry refused the renewed token, and the configured one has expired: mint a new token", "expired", fmtTime(k.confInfo.Expires.Time))
		return
	}
	k.log.Warn("agent token: the registry refused the renewed token; going back to the configured one", "expires", fmtTime(k.confInfo.Expires.Time))
	k.cur, k.info = k.lastConf, k.confInfo
	k.mu.Unlock()
	k.fileMu.Lock()
	defer k.fileMu.Unlock()
	if err := os.Remove(k.path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		k.log.Warn("agent token: the refused renewal cannot be removed", "path", k.path, "err", err)
	}
}

// Run renews the token as it ages until ctx ends. renew is POST
// /v1/tokens/renew, sent with the token in use.
func (k *tokenKeeper) Run(ctx context.Context, renew func(context.Context) (client.RenewedToken, error)) {
	for {
		wait := k.step(ctx, renew)
		if !lifecycle.Sleep(ctx, wait) {
			return
		}
	}
}

// step renews the token if it is due, warns if it ages unrenewed, and
// returns when to look again.
func (k *tokenKeeper) step(ctx context.Context, renew func(context.Context) (client.RenewedToken, error)) time.Duration {
	maxWait := k.check
	if maxWait <= 0 {
		maxWait = time.Minute
	}
	if _, err := k.Token(ctx); err != nil {
		return maxWait
	}
	k.mu.Lock()
	info, cur, skew := k.info, k.cur, k.skew
	refused := k.refused != "" && k.refused == info.lineage() && k.now().Before(k.retryAt)
	k.mu.Unlock()
	if info.Expires.IsZero() {
		return maxWait // not a JWT: the server will say what is wrong with it
	}
	now := k.now().Add(skew)
	life := info.Expires.Sub(info.Issued.Time)
	if info.Issued.IsZero() || life <= 0 {
		life = tokenWarnBefore
	}
	left := info.Expires.Sub(now)
	wait := min(maxWait, max(life/20, 100*time.Millisecond))
	if !info.renewable() || refused {
		if left < tokenWarnBefore {
			k.warn(now, "agent token expires and will not be renewed: mint a token with registryd token --role agent --ip ADDR and put it in REGISTRY_TOKEN or REGISTRY_TOKEN_FILE",
				"expires", fmtTime(info.Expires.Time), "left", auth.FormatDuration(left.Round(time.Second)))
		}
		return maxWait
	}
	if left > life/3 {
		return min(wait, left-life/3)
	}
	out, err := renew(ctx)
	if err != nil {
		if ce, ok := errors.AsType[*client.Error](err); ok && ce.Code == client.CodeTokenNotRenewable {
			// Asked again later: another replica, or the same one once
			// its configuration is set right, may renew it.
			k.mu.Lock()
			k.refused, k.retryAt = info.lineage(), k.now().Add(min(time.Hour, max(left/4, time.Second)))
			k.mu.Unlock()
		}
		k.log.Warn("agent token: renewal failed; retrying", "err", err,
			"expires", fmtTime(info.Expires.Time), "left", auth.FormatDuration(left.Round(time.Second)))
		return wait
	}
	ni, err := readTokenInfo(out.Token)
	if err != nil {
		k.log.Error("agent token: the renewal is not a token", "err", err)
		return wait
	}
	k.mu.Lock()
	if k.cur != cur {
		k.mu.Unlock()
		return wait // the configured token changed meanwhile: it wins
	}
	k.cur, k.info = out.Token, ni
	k.skew = ni.Issued.Sub(k.now()) // within a second: iat counts seconds
	k.mu.Unlock()
	k.keep(out.Token)
	k.log.Info("agent token renewed", "expires", fmtTime(out.Expires), "lineage", out.Lineage)
	return wait
}

// keep writes token where a restart finds it, unless it is no longer the
// token in use (refused meanwhile).
func (k *tokenKeeper) keep(token string) {
	k.fileMu.Lock()
	defer k.fileMu.Unlock()
	k.mu.Lock()
	current := k.cur == token
	k.mu.Unlock()
	if !current {
		return
	}
	if err := agent.WriteFileAtomic(k.path, []byte(token+"\n")); err != nil {
		k.log.Warn("agent token: the renewal cannot be kept for a restart", "path", k.path, "err", err)
	}
}

// warn logs msg at most once a day.
func (k *tokenKeeper) warn(now time.Time, msg string, args ...any) {
	k.mu.Lock()
	due := k.warned.IsZero() || now.Sub(k.warned) >= 24*time.Hour
	if due {
		k.warned = now
	}
	k.mu.Unlock()
	if due {
		k.log.Warn(msg, args...)
	}
}

func fmtTime(t time.Time) string { return t.UTC().Format(time.RFC3339) }
