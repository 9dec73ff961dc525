package client_test

import (
	"slices"
	"testing"

	"github.com/registryd/registryd/client"
	"github.com/registryd/registryd/internal/apitest"
)

// The client's Code constants are exactly the codes openapi.yaml
// documents.
func TestCodesMatchSpec(t *testing.T) {
	t.Parallel()
	documented, err := apitest.DocumentedCodes()
	if err != nil {
		t.Fatal(err)
	}
	ours := []string{
		client.CodeJobOwnedByOther, client.CodeInsufficientCapacity, client.CodeNoSingleHost,
		client.CodeNotEnoughHosts, client.CodeNoFabricFit,
		client.CodeLeaseExpired, client.CodeJobHoldsNothing, client.CodeTooManyMatched, client.CodeTokenNotRenewable,
		client.CodeIdempotencyKeyReused, client.CodeIdempotentAnswerLost, client.CodeIdempotencyKeyTakenOver,
		client.CodeInvalidRequest, client.CodeUnauthorized, client.CodeForbidden, client.CodeNotFound,
		client.CodeMethodNotAllowed, client.CodeConflict, client.CodePreconditionFailed,
		client.CodeBodyTooLarge, client.CodeUnsupportedMediaType, client.CodeTooManyRequests,
		client.CodeInternalError, client.CodeBusy, client.CodeUnavailable,
	}
	slices.Sort(documented)
	slices.Sort(ours)
	if !slices.Equal(documented, ours) {
		t.Errorf("codes: openapi.yaml documents %v, the client has %v", documented, ours)
	}
}
