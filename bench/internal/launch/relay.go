package launch

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-zeromq/zmq4"

	"github.com/omnious/provider-node/endpoint"
	"github.com/omnious/provider-node/engines/kvevents"
)

// KVRelay carries a fleet's KV events to a router's bound socket, as
// engines publish them in vLLM's centralized mode (llm-d's global socket):
// it subscribes to every replica's own PUB socket and publishes each
// message, by connecting to the router, under the replica's topic
// kv@<ip>:<port>@<model>, sequence and payload unchanged. The bench's
// replicas bind their sockets before any EPP runs; the relay connects
// once the EPP listens, so nothing is published before it can be heard.
type KVRelay struct {
	cancel context.CancelFunc
	wg     sync.WaitGroup
	subs   []zmq4.Socket
	pub    zmq4.Socket

	relayed atomic.Int64

	mu  sync.Mutex // one sender at a time on pub
	err error      // the first relay failure, for Close
}

// Relayed is how many messages (KV-event batches) it has relayed.
func (r *KVRelay) Relayed() int64 { return r.relayed.Load() }

// RelayTopic is the topic a replica's events carry through the relay.
func RelayTopic(ep endpoint.Endpoint) string { return "kv@" + ep.Addr + "@" + ep.Model }

// ConnectView is the fleet as an EPP behind a relay sees it: each replica
// publishes by connecting (KVConnect), with no socket or replay of its own.
func ConnectView(eps []endpoint.Endpoint) []endpoint.Endpoint {
	out := make([]endpoint.Endpoint, len(eps))
	for i, ep := range eps {
		ep.KVEvents, ep.KVReplay, ep.KVConnect = "", "", ep.KVEvents != ""
		out[i] = ep
	}
	return out
}

// StartKVRelay subscribes to each replica with KV events and relays to
// router (tcp://host:port, loopback), until Close.
func StartKVRelay(eps []endpoint.Endpoint, router string) (*KVRelay, error) {
	ctx, cancel := context.WithCancel(context.Background())
	r := &KVRelay{cancel: cancel}
	// Like an engine's connecting publisher, follow the router across its
	// restarts.
	r.pub = zmq4.NewPub(ctx, zmq4.WithAutomaticReconnect(true))
	if err := r.pub.Dial(router); err != nil {
		cancel()
		return nil, fmt.Errorf("KV-event relay: cannot connect to %s: %w", router, err)
	}
	for _, ep := range eps {
		if ep.KVEvents == "" {
			continue
		}
		sub := zmq4.NewSub(ctx, zmq4.WithAutomaticReconnect(true))
		r.subs = append(r.subs, sub)
		if err := sub.Dial(ep.KVEvents); err != nil {
			return nil, errors.Join(fmt.Errorf("KV-event relay: cannot subscribe to %s: %w", ep.KVEvents, err), r.Close())
		}
		if err := sub.SetOption(zmq4.OptionSubscribe, ""); err != nil {
			return nil, errors.Join(fmt.Errorf("KV-event relay: %w", err), r.Close())
		}
		r.wg.Add(1)
		go r.relay(ctx, sub, []byte(RelayTopic(ep)))
	}
	return r, nil
}

// relay forwards one replica's messages until ctx ends.
func (r *KVRelay) relay(ctx context.Context, sub zmq4.Socket, topic []byte) {
	defer r.wg.Done()
	for {
		msg, err := sub.Recv()
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			// A replica gone or restarting: its socket reconnects.
			r.fail(fmt.Errorf("KV-event relay: %w", err))
			time.Sleep(20 * time.Millisecond)
			continue
		}
		_, seq, payload, err := kvevents.ParseMessage(msg.Frames)
		if err != nil {
			r.fail(fmt.Errorf("KV-event relay: %w", err))
			continue
		}
		r.mu.Lock()
		err = r.pub.SendMulti(zmq4.NewMsgFrom(kvevents.MessageFrames(topic, seq, payload)...))
		r.mu.Unlock()
		if err == nil {
			r.relayed.Add(1)
		} else if ctx.Err() == nil {
			r.fail(fmt.Errorf("KV-event relay: cannot publish: %w", err))
		}
	}
}

func (r *KVRelay) fail(err error) {
	r.mu.Lock()
	if r.err == nil {
		r.err = err
	}
	r.mu.Unlock()
}

// Close stops relaying and reports the first failure, if any.
func (r *KVRelay) Close() error {
	r.cancel()
	var errs []error
	for _, s := range r.subs {
		errs = append(errs, s.Close())
	}
	r.wg.Wait()
	errs = append(errs, r.pub.Close())
	r.mu.Lock()
	defer r.mu.Unlock()
	return errors.Join(append([]error{r.err}, ignoreClosed(errs)...)...)
}

// ignoreClosed drops the errors of closing sockets already closed by the
// cancelled context.
func ignoreClosed(errs []error) []error {
	var out []error
	for _, err := range errs {
		if err != nil && !errors.Is(err, context.Canceled) {
			out = append(out, err)
		}
	}
	return out
}
