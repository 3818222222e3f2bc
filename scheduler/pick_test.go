package scheduler

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestPickWhilePoolChanges: Pick reads the snapshot behind its atomic
// pointer and never takes the lock SetEndpoints holds, so a decision is
// not held up by a pool update in progress (held here for good). A mutex
// is no durable block for synctest, so the bound is a generous timer: a
// Pick that waited for the lock would wait for ever.
func TestPickWhilePoolChanges(t *testing.T) {
	e := newEnv(t, 4, nil)
	e.freshAll()
	e.s.mu.Lock()
	defer e.s.mu.Unlock()
	picked := make(chan *Decision, 1)
	go func() {
		d, err := e.s.Pick(&Request{Model: testModel, Tokens: tokens(256, 1)}, nil)
		if err != nil {
			d = nil
		}
		picked <- d
	}()
	select {
	case d := <-picked:
		require.NotNil(t, d)
		d.Done(DoneInfo{Status: 200})
	case <-time.After(30 * time.Second):
		t.Fatal("Pick waited for SetEndpoints' lock")
	}
}
