package main

import (
	"errors"
	"fmt"
	"net/url"
	"regexp"
	"strconv"
	"strings"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
)

// databaseURLProblem says what is wrong with REGISTRY_DATABASE_URL, or ""
// if pgx can use it. The answer never quotes the password, nor any part of
// the value that might be one: a URL whose password holds an unescaped /
// or @ parses into a "host" or "port" made of the password.
func databaseURLProblem(raw string) string {
	msg := describeDatabaseURL(raw)
	for _, pw := range passwordsIn(raw) {
		if strings.Contains(msg, pw) {
			return "cannot be parsed (the details would show the password; check the URL's syntax)"
		}
	}
	return msg
}

// schemeRE is what may be quoted back of a scheme: a word, nothing else.
var schemeRE = regexp.MustCompile(`^[A-Za-z][A-Za-z0-9+.-]{0,19}$`)

// keyRE is what may be quoted back of a parameter name.
var keyRE = regexp.MustCompile(`^[a-z][a-z0-9_]{0,40}$`)

const escapeHint = "percent-encode / ? # @ : % in the user name and password (%2F %3F %23 %40 %3A %25)"

func describeDatabaseURL(raw string) string {
	if strings.ContainsRune(raw, 0) {
		return "contains a NUL byte"
	}
	i := strings.Index(raw, "://")
	if i < 0 {
		if !strings.Contains(raw, "=") {
			return "neither a URL (postgres://USER:PASSWORD@HOST:5432/DATABASE) nor key=value settings (host=... dbname=...)"
		}
		return pgxProblem(raw) // key=value settings
	}
	if scheme := raw[:i]; scheme != "postgres" && scheme != "postgresql" {
		if schemeRE.MatchString(scheme) {
			return fmt.Sprintf("scheme must be postgres or postgresql, not %q", scheme)
		}
		return "scheme must be postgres or postgresql"
	}
	u, err := url.Parse(raw)
	if err != nil {
		var ue *url.Error
		inner := ""
		if errors.As(err, &ue) {
			inner = ue.Err.Error()
		}
		switch {
		case strings.Contains(inner, "invalid port"):
			return "bad port: it must be a number between 1 and 65535 (or the password holds a / ? or #: " + escapeHint + ")"
		case strings.Contains(inner, "invalid userinfo"):
			return "the user name or password holds a character that must be escaped: " + escapeHint
		case strings.Contains(inner, "invalid URL escape"):
			return "a % not followed by two hex digits (write % as %25)"
		case strings.Contains(inner, "invalid character"):
			return "invalid character in the host name"
		}
		return "not a valid URL"
	}
	if u.Host == "" && u.Query().Get("host") == "" {
		if strings.Contains(u.Path+u.RawQuery+u.Fragment, "@") {
			return "missing host: the part before the @ holds a / ? or #; " + escapeHint
		}
		return "missing host: write postgres://USER:PASSWORD@HOST:5432/DATABASE (or give ?host=/path/to/socket/dir)"
	}
	if u.Host != "" {
		for _, hp := range strings.Split(u.Host, ",") {
			host, port := hp, ""
			if j := strings.LastIndex(hp, ":"); j >= 0 && !strings.HasSuffix(hp, "]") {
				host, port = hp[:j], hp[j+1:]
			}
			if host == "" {
				return "missing host: an empty host name in the host list"
			}
			if port != "" {
				if n, err := strconv.Atoi(port); err != nil || n < 1 || n > 65535 {
					return "bad port: it must be a number between 1 and 65535"
				}
			}
		}
	}
	for k := range u.Query() {
		if known := closestKnownParam(k); known != "" {
			if !keyRE.MatchString(k) {
				return "unknown parameter (did you mean " + known + "?)"
			}
			return fmt.Sprintf("unknown parameter %q (did you mean %s?)", k, known)
		}
	}
	return pgxProblem(raw)
}

// pgxProblem is pgx's own verdict on raw, without the connection string
// its error quotes (redacted only as well as pgx can).
func pgxProblem(raw string) string {
	_, err := pgxpool.ParseConfig(raw)
	if err == nil {
		return ""
	}
	var ue *url.Error
	if errors.As(err, &ue) {
		return "not a valid URL"
	}
	var pe *pgconn.ParseConfigError
	if !errors.As(err, &pe) {
		return "cannot be parsed"
	}
	s := pe.Error()
	j := strings.LastIndex(s, "`: ")
	if j < 0 {
		return "cannot be parsed"
	}
	return s[j+3:]
}

// knownParams are the connection parameters pgx reads itself, and common
// server settings; any other parameter is sent to the server as a setting.
var knownParams = []string{
	"host", "port", "dbname", "database", "user", "password", "passfile", "connect_timeout",
	"sslmode", "sslkey", "sslcert", "sslcertmode", "sslrootcert", "sslnegotiation", "sslpassword", "sslsni",
	"krbspn", "krbsrvname", "target_session_attrs", "service", "servicefile", "min_protocol_version",
	"max_protocol_version", "channel_binding", "require_auth",
	"statement_cache_capacity", "description_cache_capacity", "default_query_exec_mode",
	"pool_max_conns", "pool_min_conns", "pool_min_idle_conns", "pool_max_conn_lifetime",
	"pool_max_conn_idle_time", "pool_health_check_period", "pool_max_conn_lifetime_jitter", "pool_ping_timeout",
	"application_name", "search_path", "timezone", "options", "client_encoding",
}

// closestKnownParam returns the known parameter k is most likely a typo
// of, or "" if k is known or looks like a server setting of its own. An
// unknown pool_ parameter is always a mistake: the server would refuse
// it at connect.
func closestKnownParam(k string) string {
	best, bestD := "", 3
	for _, p := range knownParams {
		if p == k {
			return ""
		}
		if d := editDistance(k, p); d < bestD {
			best, bestD = p, d
		}
	}
	switch {
	case best != "" && (bestD == 1 || (bestD == 2 && len(k) >= 5)):
		return best
	case strings.HasPrefix(k, "pool_"):
		return "pool_max_conns"
	}
	return ""
}

// editDistance is the Levenshtein distance between a and b.
func editDistance(a, b string) int {
	prev := make([]int, len(b)+1)
	cur := make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}

var dsnPasswordRE = regexp.MustCompile(`password\s*=\s*('(?:[^'\\]|\\.)*'|\S+)`)

// passwordsIn guesses every string in raw that may be a password, however
// malformed raw is: after the scheme, up to the last @, past the first
// colon (as written and decoded), and password= values.
func passwordsIn(raw string) []string {
	var out []string
	add := func(s string) {
		if len(s) >= 3 {
			out = append(out, s)
			if d, err := url.PathUnescape(s); err == nil && d != s && len(d) >= 3 {
				out = append(out, d)
			}
		}
	}
	if i := strings.Index(raw, "://"); i >= 0 {
		rest := raw[i+3:]
		if at := strings.LastIndex(rest, "@"); at >= 0 {
			if c := strings.Index(rest[:at], ":"); c >= 0 {
				add(rest[c+1 : at])
			}
		}
	}
	for _, m := range dsnPasswordRE.FindAllStringSubmatch(raw, -1) {
		add(strings.Trim(m[1], "'&"))
		if amp := strings.IndexByte(m[1], '&'); amp >= 0 {
			add(m[1][:amp])
		}
	}
	return out
}
