package main

import (
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"
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
}

func loadConfig(getenv func(string) string) (config, error) {
	c := config{
		DatabaseURL:     getenv("REGISTRY_DATABASE_URL"),
		Listen:          or(getenv("REGISTRY_LISTEN"), "127.0.0.1:8080"),
		DataDir:         or(getenv("REGISTRY_DATA_DIR"), "./.data"),
		DataDirSet:      getenv("REGISTRY_DATA_DIR") != "",
		LogFormat:       or(getenv("REGISTRY_LOG_FORMAT"), "json"),
		ShutdownTimeout: 15 * time.Second,
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
