package kvevents

import (
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
	"go.uber.org/zap/zaptest/observer"

	"github.com/omnious/provider-node/internal/testutil/freeport"
)

// TestPublisherDialsBeforeSubscriberListens: a dialing publisher started
// before its subscriber listens (the simulator in connect mode started
// before the EPP) is created, redials until it is let in, logs the wait
// once and the connection once, and its batches then arrive.
func TestPublisherDialsBeforeSubscriberListens(t *testing.T) {
	for _, wait := range []time.Duration{0, 2 * dialWarnAfter} {
		t.Run("listens after "+wait.String(), func(t *testing.T) {
			core, logs := observer.New(zapcore.InfoLevel)
			ep := "tcp://127.0.0.1:" + strconv.Itoa(port(t))
			topic := "kv@10.0.0.1:8000@m"
			p, err := NewPublisher(PublisherConfig{Endpoint: ep, Dial: true, Topic: topic, Format: FormatMap, DialRetry: 20 * time.Millisecond}, zap.New(core))
			require.NoError(t, err, "a refused first dial must not fail the publisher")
			t.Cleanup(func() { require.NoError(t, p.Close()) })
			unheard, err := p.Publish(storedEvent(hashFor(1, 0)))
			require.NoError(t, err, "publishing while the subscriber is away")
			time.Sleep(wait)

			rec := &recorder{}
			startSubscriber(t, SubscriberConfig{Endpoint: ep, Bind: true, Topic: "kv@"}, rec)
			seq := connect(t, p, rec, topic)
			require.Greater(t, seq, unheard)

			waits := logs.FilterMessageSnippet("cannot reach its subscriber").Len()
			connected := logs.FilterMessage("KV-event publisher connected").Len()
			if wait == 0 {
				require.Zero(t, waits+connected, "a subscriber up within %v is no outage", dialWarnAfter)
				return
			}
			require.Equal(t, 1, waits, "one warning per wait, not one per dial")
			require.Equal(t, 1, connected)
			require.Zero(t, logs.FilterMessage("KV-event publisher gave up dialing").Len())
		})
	}
}

// TestPublisherCloseStopsDialing: Close ends the redialing of a publisher
// whose subscriber never came, promptly and without an error logged.
func TestPublisherCloseStopsDialing(t *testing.T) {
	core, logs := observer.New(zapcore.InfoLevel)
	ep := "tcp://127.0.0.1:" + strconv.Itoa(port(t))
	p, err := NewPublisher(PublisherConfig{Endpoint: ep, Dial: true, DialRetry: 10 * time.Millisecond}, zap.New(core))
	require.NoError(t, err)
	time.Sleep(50 * time.Millisecond)
	start := time.Now()
	require.NoError(t, p.Close())
	require.Less(t, time.Since(start), time.Second)
	time.Sleep(50 * time.Millisecond) // the dialer's last pause
	require.Zero(t, logs.FilterLevelExact(zapcore.ErrorLevel).Len(), "closing is not a failed dial")
}

// TestPublisherDialRefusesBadEndpoints: what no redial can fix fails at
// once.
func TestPublisherDialRefusesBadEndpoints(t *testing.T) {
	for _, ep := range []string{"127.0.0.1:5557", "tcp://", "udpx://127.0.0.1:5557"} {
		_, err := NewPublisher(PublisherConfig{Endpoint: ep, Dial: true}, zap.NewNop())
		require.Error(t, err, ep)
	}
	_, err := NewPublisher(PublisherConfig{Endpoint: "tcp://127.0.0.1:1", Dial: true, DialRetry: -time.Second}, zap.NewNop())
	require.Error(t, err, "a negative DialRetry")
}

func port(t *testing.T) int {
	t.Helper()
	ps, err := freeport.Take(1)
	require.NoError(t, err)
	return ps[0]
}
