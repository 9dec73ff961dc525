package main

import (
	"crypto"
	"fmt"
	"log/slog"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/registryd/registryd/internal/auth"
)

// config is every setting, loaded once from the environment and validated.
type config struct {
	DatabaseURL     string        // REGISTRY_DATABASE_URL; empty: embedded PostgreSQL
	Listen          string        // REGISTRY_LISTEN
	DataDir         string        // REGISTRY_DATA_DIR (embedded PostgreSQL's data)
	DataDirSet      bool          // whether REGISTRY_DATA_DIR was given
	Migrate         bool          // REGISTRY_MIGRATE: migrate up at start
	LogLevel        slog.Level    // REGISTRY_LOG_LEVEL
	LogFormat       string        // REGISTRY_LOG_FORMAT: json or text
	MaxConns        int32         // REGISTRY_DB_MAX_CONNS
	ShutdownTimeout time.Duration // REGISTRY_SHUTDOWN_TIMEOUT

	JWTSecret     []byte             // REGISTRY_JWT_SECRET or the file REGISTRY_JWT_SECRET_FILE names
	JWTPublicKeys []crypto.PublicKey // from the PEM file REGISTRY_JWT_PUBLIC_KEYS names
	JWTIssuer     string             // REGISTRY_JWT_ISSUER
	JWTAudience   string             // REGISTRY_JWT_AUDIENCE

	WatchRetention time.Duration // REGISTRY_WATCH_RETENTION: how long watch events stay resumable
}

func loadConfig(getenv func(string) string) (config, error) {
	c := config{
		DatabaseURL:     getenv("REGISTRY_DATABASE_URL"),
		Listen:          or(getenv("REGISTRY_LISTEN"), "127.0.0.1:8080"),
		DataDir:         or(getenv("REGISTRY_DATA_DIR"), "./.data"),
		DataDirSet:      getenv("REGISTRY_DATA_DIR") != "",
		LogFormat:       or(getenv("REGISTRY_LOG_FORMAT"), "json"),
		ShutdownTimeout: 15 * time.Second,
		WatchRetention:  24 * time.Hour,
	}
	var errs []string
	if v := getenv("REGISTRY_MIGRATE"); v != "" {
		b, err := strconv.ParseBool(v)
		if err != nil {
			errs = append(errs, fmt.Sprintf("REGISTRY_MIGRATE=%q: want true or false", v))
		}
		c.Migrate = b
	}
	if v := getenv("REGISTRY_LOG_LEVEL"); v != "" {
		if err := c.LogLevel.UnmarshalText([]byte(v)); err != nil {
			errs = append(errs, fmt.Sprintf("REGISTRY_LOG_LEVEL=%q: want debug, info, warn or error", v))
		}
	}
	if c.LogFormat != "json" && c.LogFormat != "text" {
		errs = append(errs, fmt.Sprintf("REGISTRY_LOG_FORMAT=%q: want json or text", c.LogFormat))
	}
	if v := getenv("REGISTRY_DB_MAX_CONNS"); v != "" {
		n, err := strconv.ParseInt(v, 10, 32)
		if err != nil || n < 1 {
			errs = append(errs, fmt.Sprintf("REGISTRY_DB_MAX_CONNS=%q: want a positive integer", v))
		}
		c.MaxConns = int32(n)
	}
	if v := getenv("REGISTRY_SHUTDOWN_TIMEOUT"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d <= 0 {
			errs = append(errs, fmt.Sprintf("REGISTRY_SHUTDOWN_TIMEOUT=%q: want a duration such as 15s", v))
		}
		c.ShutdownTimeout = d
	}
	if v := getenv("REGISTRY_WATCH_RETENTION"); v != "" {
		d, err := time.ParseDuration(v)
		if err != nil || d < time.Minute {
			errs = append(errs, fmt.Sprintf("REGISTRY_WATCH_RETENTION=%q: want a duration of at least 1m, such as 24h", v))
		}
		c.WatchRetention = d
	}
	c.JWTIssuer = getenv("REGISTRY_JWT_ISSUER")
	c.JWTAudience = getenv("REGISTRY_JWT_AUDIENCE")
	secret, file := getenv("REGISTRY_JWT_SECRET"), getenv("REGISTRY_JWT_SECRET_FILE")
	switch {
	case secret != "" && file != "":
		errs = append(errs, "set REGISTRY_JWT_SECRET or REGISTRY_JWT_SECRET_FILE, not both")
	case secret != "":
		c.JWTSecret = []byte(secret)
	case file != "":
		b, err := os.ReadFile(file)
		if err != nil {
			errs = append(errs, fmt.Sprintf("REGISTRY_JWT_SECRET_FILE: %v", err))
		}
		c.JWTSecret = []byte(strings.TrimRight(string(b), "\r\n"))
	}
	if c.JWTSecret != nil && len(c.JWTSecret) < auth.MinSecretBytes {
		// Never print the secret itself, only its length.
		errs = append(errs, fmt.Sprintf("the JWT secret (REGISTRY_JWT_SECRET or _FILE) is %d bytes; it must be at least %d (e.g. openssl rand -hex 32)", len(c.JWTSecret), auth.MinSecretBytes))
	}
	if path := getenv("REGISTRY_JWT_PUBLIC_KEYS"); path != "" {
		b, err := os.ReadFile(path)
		if err == nil {
			c.JWTPublicKeys, err = auth.ParsePublicKeys(b)
		}
		if err != nil {
			errs = append(errs, fmt.Sprintf("REGISTRY_JWT_PUBLIC_KEYS: %v", err))
		}
	}
	if len(errs) > 0 {
		return c, fmt.Errorf("configuration: %s", strings.Join(errs, "; "))
	}
	return c, nil
}

func or(v, def string) string {
	if v == "" {
		return def
	}
	return v
}
