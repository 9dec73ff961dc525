package main

import (
	"cmp"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io/fs"
	"log/slog"
	"os"
	"path/filepath"

	"github.com/registryd/registryd/internal/auth"
	"github.com/registryd/registryd/internal/pglocal"
	"github.com/registryd/registryd/internal/store"
)

// database is an open store plus whatever must be stopped after it.
type database struct {
	store      *store.Store
	cluster    *pglocal.Cluster // the embedded PostgreSQL when this process runs it; else nil
	onEmbedded bool             // the embedded PostgreSQL, ours or another registryd's
	close      func()
}

// embedded reports whether this is registryd's own PostgreSQL.
func (db *database) embedded() bool { return db.onEmbedded }

// openDatabase connects to REGISTRY_DATABASE_URL or, when it is unset, to
// the data folder's embedded PostgreSQL: the one a running registryd
// (serve, say) runs, or one started for this command and stopped by
// close. claim is the embedded PostgreSQL already claimed (serve claims it
// early); nil claims it here for command. close releases the claim too.
func openDatabase(ctx context.Context, cfg config, logger *slog.Logger, command string, claim *embeddedClaim) (*database, error) {
	url := cfg.DatabaseURL
	if cfg.DatabaseURL == "" {
		if claim == nil {
			var err error
			if claim, err = claimEmbedded(ctx, cfg, logger, command); err != nil {
				return nil, err
			}
		}
		u, err := claim.start(ctx)
		if err != nil {
			claim.release(ctx)
			return nil, err
		}
		url = u
	}
	st, err := store.Open(ctx, url, store.Options{MaxConns: cfg.MaxConns, AcquireTimeout: cfg.AcquireTimeout,
		StatementTimeout: cfg.StatementTimeout, IdleInTransactionTimeout: cfg.IdleInTxTimeout, LockTimeout: cfg.LockTimeout,
		ObserveQuery: cfg.observeQuery,
		ObserveGroup: cfg.observeGroup, Migrations: cfg.migrations})
	if err != nil {
		claim.release(ctx)
		return nil, err
	}
	db := &database{store: st, onEmbedded: claim != nil, close: func() { st.Close(); claim.release(ctx) }}
	if claim != nil {
		db.cluster = claim.cluster
	}
	return db, nil
}

// embeddedDataDir resolves REGISTRY_DATA_DIR for the embedded default. It
// holds the PostgreSQL cluster (postgres/) and the token secret
// (jwt-secret). As root the server runs as the postgres user, which may not
// be able to enter the checkout (under /root, say); rather than fail on a
// fresh clone, the data then goes to a directory of its own under
// /var/lib/registryd, named after the checkout so each checkout keeps its
// own data. Whichever it is, it must be ours and closed to other users'
// writes (privateDir), or nothing starts.
//
// With create false (`registryd token`, which only reads) nothing is
// created, and the folder returned may not exist.
func embeddedDataDir(cfg config, logger *slog.Logger, create bool) (string, error) {
	dir, err := filepath.Abs(cfg.DataDir)
	if err != nil {
		return "", err
	}
	// Someone else's folder is refused as such, before asking whether the
	// postgres user can enter it.
	if err := checkPrivateDir(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return "", err
	}
	// 0711 as root: the postgres user passes through to its cluster, and
	// nobody else lists the directory; the secret file itself is 0600.
	mode := os.FileMode(0o700)
	if os.Geteuid() == 0 {
		mode = 0o711
	}
	if err := pglocal.CheckAccess(filepath.Join(dir, "postgres")); err != nil {
		if cfg.DataDirSet || os.Geteuid() != 0 {
			return "", err
		}
		// Not /var/tmp or /tmp: anyone can create a directory there first
		// and hand us their own secret. Only root can create in /var/lib.
		base := cmp.Or(cfg.embedded.fallbackBase, fallbackBase)
		if err := fallbackBaseDir(base, create); err != nil {
			return "", err
		}
		sum := sha256.Sum256([]byte(dir))
		alt := filepath.Join(base, hex.EncodeToString(sum[:6]))
		logger.Warn("data directory is not reachable by the postgres user; using another",
			"wanted", dir, "using", alt, "reason", err.Error(), "hint", "set REGISTRY_DATA_DIR to choose")
		// Earlier versions fell back to /var/tmp; what is there may be
		// ours or planted, so it is never picked up by itself.
		if old := filepath.Join("/var/tmp", "registryd-"+hex.EncodeToString(sum[:6])); old != alt {
			if _, err := os.Lstat(old); err == nil {
				logger.Warn("an earlier registryd kept this checkout's data in a folder anyone could have made; it is not used",
					"ignored", old, "hint", "if it is yours, check it and move it to "+alt)
			}
		}
		dir = alt
	}
	if !create {
		if err := checkPrivateDir(dir); err != nil && !errors.Is(err, fs.ErrNotExist) {
			return "", err
		}
		return dir, nil
	}
	if err := privateDir(dir, mode); err != nil {
		return "", err
	}
	return dir, nil
}

// fallbackBaseDir makes (or, with create false, checks if it exists) the
// base of the root fallback.
func fallbackBaseDir(base string, create bool) error {
	if create {
		return privateDir(base, 0o711)
	}
	if err := checkPrivateDir(base); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// tokenSecret returns the HS256 secret: the configured one, or for the
// embedded default the one kept in the data directory, which only serve
// makes (on first use). created reports whether this call made it.
func tokenSecret(cfg config, logger *slog.Logger) (secret []byte, created bool, err error) {
	if cfg.JWTSecret != nil || len(cfg.JWTPublicKeys) > 0 {
		return cfg.JWTSecret, false, nil
	}
	if cfg.DatabaseURL != "" {
		return nil, false, errNoKeys
	}
	dir, err := embeddedDataDir(cfg, logger, true)
	if err != nil {
		return nil, false, err
	}
	secret, created, err = auth.LoadOrCreateSecret(filepath.Join(dir, "jwt-secret"))
	if err != nil {
		return nil, false, fmt.Errorf("token secret: %w (or set REGISTRY_DATA_DIR to a directory of your own)", err)
	}
	return secret, created, nil
}

var errNoKeys = errors.New("no token keys configured: with REGISTRY_DATABASE_URL set, set REGISTRY_JWT_SECRET (at least 32 bytes, e.g. `openssl rand -hex 32`), REGISTRY_JWT_SECRET_FILE or REGISTRY_JWT_PUBLIC_KEYS; every replica needs the same keys")

// existingTokenSecret is tokenSecret for `registryd token`, which never
// makes a secret: a token signed with a new one would be refused by every
// server. It finds the data folder exactly as serve does.
func existingTokenSecret(cfg config, logger *slog.Logger) ([]byte, error) {
	if cfg.JWTSecret != nil || len(cfg.JWTPublicKeys) > 0 {
		return cfg.JWTSecret, nil
	}
	if cfg.DatabaseURL != "" {
		return nil, errNoKeys
	}
	dir, err := embeddedDataDir(cfg, logger, false)
	if err != nil {
		return nil, err
	}
	path := filepath.Join(dir, "jwt-secret")
	secret, err := auth.LoadSecret(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("no token secret: REGISTRY_JWT_SECRET and REGISTRY_JWT_SECRET_FILE are unset, and the data folder %s holds no jwt-secret "+
			"(`registryd serve` makes it there on its first start). Run this where the server runs (REGISTRY_DATA_DIR defaults to ./.data, relative to the working directory), "+
			"set REGISTRY_DATA_DIR to the server's data folder, or set REGISTRY_JWT_SECRET or REGISTRY_JWT_SECRET_FILE to the server's key", dir)
	}
	if err != nil {
		return nil, fmt.Errorf("token secret: %w (or set REGISTRY_DATA_DIR to a directory of your own)", err)
	}
	return secret, nil
}

// openMigrated opens the database and makes sure its schema is the
// binary's (migrating when allowed): what serve and sync both need.
func openMigrated(ctx context.Context, cfg config, logger *slog.Logger, command string, claim *embeddedClaim) (*database, error) {
	db, err := openDatabase(ctx, cfg, logger, command, claim)
	if err != nil {
		return nil, err
	}
	if err := prepareSchema(ctx, db, cfg.Migrate, logger); err != nil {
		db.close()
		return nil, err
	}
	return db, nil
}

// prepareSchema migrates when allowed, then refuses a schema this binary
// may not serve: older than its own, or newer through a migration that
// does not let older replicas serve (store.SchemaState.OK).
func prepareSchema(ctx context.Context, db *database, migrate bool, logger *slog.Logger) error {
	if migrate || db.embedded() {
		m, err := db.store.NewMigrator(logger)
		if err != nil {
			return err
		}
		defer m.Close()
		res, err := m.Up(ctx)
		if err != nil {
			return err
		}
		for _, r := range res {
			logger.Info("migrated", "migration", r.String())
		}
	}
	st, err := db.store.CheckSchema(ctx)
	if err != nil {
		return err
	}
	if !st.OK() {
		return errors.New(st.Problem())
	}
	if st.Current > st.Latest {
		warnNewerSchema(logger, st)
	}
	return nil
}
