package api

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/registryd/registryd/internal/registry"
)

// Idempotency-Key (claim, release, renew, cordon, uncordon): the first
// request of a principal with a key runs, and its answer is kept for
// Config.IdempotencyKeep; a retry with the same key and the same path and
// body gets that answer, from any replica, with Idempotent-Replayed: true.
// The same key with another path or body is a 422. A retry arriving while
// the first still runs waits for it. The runner holds the key for its
// lease (Config.IdempotencyLease) and stops its request a fifth of it
// before; its transaction commits only while the key is still its own
// (registry.KeyHold, checked before the COMMIT). So a replica that dies
// mid-request is taken for dead once its lease has run out: the retry
// takes the key over (waiting for a COMMIT of the runner on its way, and
// failing any later one), and the audit log then says whether the runner
// changed anything (nothing: the retry runs it; something: the retry is
// told which nodes in a 409 idempotent_answer_lost).

// DefaultIdempotencyKeep is how long an answer is kept by default.
const DefaultIdempotencyKeep = 24 * time.Hour

// DefaultIdempotencyLease is how long a runner holds a key by default; it
// stops its request a fifth of it before, and the store commits its
// changes only while the lease holds (registry.KeyHold).
const DefaultIdempotencyLease = 10 * time.Second

// idemPoll is how often a retry looks at a key whose request still runs.
const idemPoll = 20 * time.Millisecond

// maxIdempotencyKey bounds the key's length.
const maxIdempotencyKey = 255

// Codes of idempotency's own answers.
const (
	codeKeyReused  = "idempotency_key_reused"
	codeAnswerLost = "idempotent_answer_lost"
)

// idempotent runs h at most once per principal and Idempotency-Key (see
// above); without the header it is h.
func (s *Server) idempotent(h handlerFunc) handlerFunc {
	return func(w http.ResponseWriter, r *http.Request) error {
		keys := r.Header.Values("Idempotency-Key")
		if len(keys) == 0 {
			return h(w, r)
		}
		key := keys[0]
		if len(keys) > 1 || !validKey(key) {
			return badRequest(fmt.Sprintf("Idempotency-Key must be one header of 1 to %d visible ASCII characters", maxIdempotencyKey))
		}
		body, err := readBody(w, r)
		if err != nil {
			return err
		}
		r.Body = io.NopCloser(bytes.NewReader(body))
		sum := sha256.Sum256(append([]byte(r.URL.Path+"\x00"), body...))
		fp := sum[:]
		a := actor(r)
		ctx := r.Context()
		for {
			rec, created, err := s.store.ReserveKey(ctx, a.Sub, key, fp, a.RequestID, s.idemLease, s.idemKeep)
			if err != nil {
				return err
			}
			switch {
			case created:
				return s.runIdempotent(w, r, h, a, key)
			case !bytes.Equal(rec.Fingerprint, fp):
				return &httpError{status: http.StatusUnprocessableEntity, code: codeKeyReused,
					detail: fmt.Sprintf("Idempotency-Key %q was first used with another request (path or body); use a new key for a new request", key)}
			case rec.Done:
				w.Header().Set("Content-Type", rec.ContentType)
				w.Header().Set("Idempotent-Replayed", "true")
				w.WriteHeader(rec.Status)
				_, _ = w.Write(rec.Body) // a caller gone away reads nothing
				return nil
			case rec.Running:
				t := time.NewTimer(idemPoll)
				select {
				case <-ctx.Done():
					t.Stop()
					return ctx.Err()
				case <-t.C:
				}
			default: // its runner was lost
				if err := s.takeOver(ctx, w, r, h, a, key, rec); err != errRetryKey {
					return err
				}
			}
		}
	}
}

// errRetryKey: another request took the lost runner's key over first.
var errRetryKey = errors.New("idempotency key taken over by another request")

// takeOver answers a retry whose first request's runner was lost: when
// that request changed nothing, the retry runs it; otherwise it keeps and
// sends the 409 that says which nodes it changed. The take-over waits for
// a transaction of the lost request still committing (it holds the key's
// row, registryd_hold_key) and makes any later one fail, so what the
// audit log shows after it is all the lost request will ever have done.
func (s *Server) takeOver(ctx context.Context, w http.ResponseWriter, r *http.Request, h handlerFunc, a registry.Actor, key string, lost registry.KeyRecord) error {
	ok, err := s.store.TakeOverKey(ctx, a.Sub, key, lost.RequestID, a.RequestID, s.idemLease)
	if err != nil {
		return err
	}
	if !ok {
		return errRetryKey
	}
	pks, err := s.store.RequestChanges(ctx, a.Sub, lost.RequestID, lost.CreatedAt)
	if err != nil {
		return err // the key stays this request's until its lease runs out: a retry decides again
	}
	if len(pks) == 0 {
		return s.runIdempotent(w, r, h, a, key)
	}
	rec := newRecorder()
	s.writeError(rec, r, registry.Coded(registry.ErrConflict, codeAnswerLost,
		"the first request with this Idempotency-Key (request %s) changed nodes %v, and its answer was lost with the replica that ran it; read those nodes", lost.RequestID, pks))
	return s.keep(ctx, w, a, key, rec)
}

// runIdempotent runs h as the key's runner, stopping it before the
// key's lease runs out, and keeps its answer; one that failed having
// changed nothing gives the key up instead, for a retry to run.
func (s *Server) runIdempotent(w http.ResponseWriter, r *http.Request, h handlerFunc, a registry.Actor, key string) error {
	ctx, cancel := context.WithTimeout(r.Context(), s.idemLease-s.idemLease/5)
	defer cancel()
	ctx = registry.WithKeyHold(ctx, registry.KeyHold{Principal: a.Sub, Key: key, RequestID: a.RequestID})
	rec := newRecorder()
	if err := h(rec, r.WithContext(ctx)); err != nil {
		s.writeError(rec, r, err)
	}
	// What is left to do is done even if the caller gave up.
	bg := context.WithoutCancel(r.Context())
	if rec.status == 0 || rec.status >= 500 {
		// A failure may hide a COMMIT still on its way: end the lease
		// first (it waits for it, and fails any later one), then look.
		err := s.store.EndKeyLease(bg, a.Sub, key, a.RequestID)
		var pks []int64
		if err == nil {
			pks, err = s.store.RequestChanges(bg, a.Sub, a.RequestID, time.Now().Add(-s.idemLease))
		}
		if err != nil {
			s.logger.WarnContext(bg, "idempotency: the outcome of a failed request is unknown; the key stays reserved until its lease runs out", "err", err)
			rec.flush(w)
			return nil
		}
		if len(pks) == 0 {
			if err := s.store.AbandonKey(bg, a.Sub, key, a.RequestID); err != nil {
				s.logger.WarnContext(bg, "idempotency: could not give up a key", "err", err)
			}
			rec.flush(w)
			return nil
		}
		// It changed nodes, but its answer is lost (its caller gave up) or
		// an error whose outcome was unknown: what retries get is what was
		// done.
		rec = newRecorder()
		s.writeError(rec, r, registry.Coded(registry.ErrConflict, codeAnswerLost,
			"the first request with this Idempotency-Key (request %s) changed nodes %v, and its answer was lost; read those nodes", a.RequestID, pks))
	}
	return s.keep(bg, w, a, key, rec)
}

// keep stores rec as the key's answer and sends it.
func (s *Server) keep(ctx context.Context, w http.ResponseWriter, a registry.Actor, key string, rec *recorder) error {
	if err := s.store.CompleteKey(ctx, a.Sub, key, a.RequestID, rec.status, rec.header.Get("Content-Type"), rec.body.Bytes()); err != nil {
		s.logger.WarnContext(ctx, "idempotency: could not keep an answer; a retry will find its runner lost", "err", err)
	}
	rec.flush(w)
	return nil
}

// validKey reports whether k is 1 to maxIdempotencyKey visible ASCII
// characters.
func validKey(k string) bool {
	if k == "" || len(k) > maxIdempotencyKey {
		return false
	}
	for i := range len(k) {
		if k[i] < 0x21 || k[i] > 0x7e {
			return false
		}
	}
	return true
}

// recorder is a ResponseWriter that keeps the answer for idempotent.
type recorder struct {
	header http.Header
	status int
	body   bytes.Buffer
}

func newRecorder() *recorder { return &recorder{header: http.Header{}} }

func (r *recorder) Header() http.Header { return r.header }

func (r *recorder) WriteHeader(status int) {
	if r.status == 0 {
		r.status = status
	}
}

func (r *recorder) Write(p []byte) (int, error) {
	r.WriteHeader(http.StatusOK)
	return r.body.Write(p)
}

// flush sends what r kept through w (nothing when nothing was written).
func (r *recorder) flush(w http.ResponseWriter) {
	if r.status == 0 {
		return
	}
	for k, v := range r.header {
		w.Header()[k] = v
	}
	w.WriteHeader(r.status)
	_, _ = w.Write(r.body.Bytes())
}
