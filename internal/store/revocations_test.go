package store_test

import (
	"context"
	"encoding/json"
	"errors"
	"testing"
	"time"

	"github.com/registryd/registryd/internal/pgtest"
	"github.com/registryd/registryd/internal/registry"
	"github.com/registryd/registryd/internal/store"
)

// A revocation and its audit entry are written in one transaction (equal
// xmin), and revoking again merges: a subject keeps the later instant, a
// token id the later (or unknown) expiry.
func TestRevokeTokens(t *testing.T) {
	t.Parallel()
	ctx := context.Background()
	st := pgtest.Open(t, pgtest.New(t), store.Options{})

	r1, err := st.RevokeTokens(ctx, sys, registry.Revocation{Sub: "leaked"})
	if err != nil {
		t.Fatal(err)
	}
	var dbNow time.Time
	st.Pool().QueryRow(ctx, `SELECT now()`).Scan(&dbNow)
	if r1.Before.Before(dbNow.Add(-2*time.Second)) || r1.Before.After(dbNow.Add(2*time.Second)) || r1.Before.Nanosecond() != 0 {
		t.Errorf("revoked_before %v: want the database's now rounded up to the second (%v)", r1.Before, dbNow)
	}
	var revXmin, auditXmin string
	var after []byte
	var action, targetType string
	var targetPK int64
	if err := st.Pool().QueryRow(ctx, `SELECT xmin::text FROM token_revocations WHERE id = $1`, r1.ID).Scan(&revXmin); err != nil {
		t.Fatal(err)
	}
	if err := st.Pool().QueryRow(ctx, `SELECT xmin::text, action, target_type, target_pk, after FROM audit_log ORDER BY id DESC LIMIT 1`).
		Scan(&auditXmin, &action, &targetType, &targetPK, &after); err != nil {
		t.Fatal(err)
	}
	if revXmin != auditXmin {
		t.Errorf("revocation xmin %s, audit xmin %s: not one transaction", revXmin, auditXmin)
	}
	var doc map[string]any
	json.Unmarshal(after, &doc)
	if action != "token.revoke" || targetType != "token" || targetPK != r1.ID || doc["sub"] != "leaked" || doc["revoked_before"] == nil {
		t.Errorf("audit entry %s %s %d %s", action, targetType, targetPK, after)
	}

	// Revoking a subject again never moves its instant back.
	st.Pool().Exec(ctx, `UPDATE token_revocations SET revoked_before = revoked_before + interval '1 hour' WHERE id = $1`, r1.ID)
	r2, err := st.RevokeTokens(ctx, sys, registry.Revocation{Sub: "leaked"})
	if err != nil {
		t.Fatal(err)
	}
	if r2.ID != r1.ID || !r2.Before.Equal(r1.Before.Add(time.Hour)) {
		t.Errorf("second revocation %+v, first %+v", r2, r1)
	}

	later, earlier := time.Now().Add(2*time.Hour).Truncate(time.Second), time.Now().Add(time.Hour).Truncate(time.Second)
	j, err := st.RevokeTokens(ctx, sys, registry.Revocation{JTI: "tok", Until: &later})
	if err != nil || j.Until == nil || !j.Until.Equal(later) {
		t.Fatalf("jti: %+v %v", j, err)
	}
	if j, _ = st.RevokeTokens(ctx, sys, registry.Revocation{JTI: "tok", Until: &earlier}); j.Until == nil || !j.Until.Equal(later) {
		t.Errorf("an earlier expiry replaced a later one: %+v", j)
	}
	if j, _ = st.RevokeTokens(ctx, sys, registry.Revocation{JTI: "tok"}); j.Until != nil {
		t.Errorf("an unknown expiry did not win: %+v", j)
	}
	var entries int
	st.Pool().QueryRow(ctx, `SELECT count(*) FROM audit_log WHERE action = 'token.revoke'`).Scan(&entries)
	if entries != 5 {
		t.Errorf("%d audit entries for 5 revocations", entries)
	}
	all, err := st.Revocations(ctx)
	if err != nil || len(all) != 2 {
		t.Errorf("Revocations: %+v %v", all, err)
	}
	if _, err := st.RevokeTokens(ctx, sys, registry.Revocation{Sub: "a", JTI: "b"}); !errors.Is(err, registry.ErrInvalid) {
		t.Errorf("sub and jti: %v", err)
	}
}
