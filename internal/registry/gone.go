package registry

import "context"

type goneKey struct{}

// WithGoneProbe returns ctx carrying gone, which reports whether the
// caller has left (its client closed the connection) even before ctx is
// cancelled for it: under load a server can notice a close later than a
// whole claim takes, and work for a caller that left is work taken from
// those still waiting.
func WithGoneProbe(ctx context.Context, gone func() bool) context.Context {
	return context.WithValue(ctx, goneKey{}, gone)
}

// Gone reports whether ctx is done or its gone probe (WithGoneProbe)
// says the caller left.
func Gone(ctx context.Context) bool {
	if ctx.Err() != nil {
		return true
	}
	gone, _ := ctx.Value(goneKey{}).(func() bool)
	return gone != nil && gone()
}
