package discovery

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/omnious/provider-node/endpoint"
)

// changeLatency makes one change and returns how long it took from just
// before the API call to the update that first shows its result.
func (w *watcher) changeLatency(tb testing.TB, what string, change func(), want ...string) time.Duration {
	tb.Helper()
	w.u.mu.Lock()
	n := len(w.u.got)
	w.u.mu.Unlock()
	start := time.Now()
	change()
	w.waitAddrs(tb, what, want...)
	w.u.mu.Lock()
	defer w.u.mu.Unlock()
	if want == nil {
		want = []string{}
	}
	for i := n; i < len(w.u.got); i++ {
		if slices.Equal(addrs(w.u.got[i]), want) {
			return w.u.at[i].Sub(start)
		}
	}
	tb.Fatalf("%s: no update shows it", what)
	return 0
}

// BenchmarkPoolChangeLatency measures, per kind of change, the time from
// the API call that makes it to the endpoint set that shows it, through a
// real kube-apiserver's watch to the Pool's informers: one change per
// iteration, reported as p50-ms and max-ms. discovery/README.md's table:
//
//	go test -run '^$' -bench PoolChangeLatency -benchtime 20x ./discovery/
//
// It fails if a change takes 1 s or more.
func BenchmarkPoolChangeLatency(b *testing.B) {
	const ip = "127.0.0.1"
	ep := ip + ":8000"
	kinds := []struct {
		name string
		// setup prepares the namespace; step makes the timed change of
		// iteration i and then undoes it untimed, both through time.
		setup func(c *cluster)
		step  func(b *testing.B, c *cluster, w *watcher, i int) time.Duration
	}{
		{
			name:  "pod ready",
			setup: func(c *cluster) { c.pod("p", ip, false, app("a")) },
			step: func(b *testing.B, c *cluster, w *watcher, _ int) time.Duration {
				d := w.changeLatency(b, "ready", func() { c.setStatus("p", ip, true) }, ep)
				w.changeLatency(b, "not ready", func() { c.setStatus("p", ip, false) })
				return d
			},
		},
		{
			name:  "pod not ready",
			setup: func(c *cluster) { c.pod("p", ip, true, app("a")) },
			step: func(b *testing.B, c *cluster, w *watcher, _ int) time.Duration {
				d := w.changeLatency(b, "not ready", func() { c.setStatus("p", ip, false) })
				w.changeLatency(b, "ready", func() { c.setStatus("p", ip, true) }, ep)
				return d
			},
		},
		{
			name:  "pod added (create, then ready)",
			setup: func(*cluster) {},
			step: func(b *testing.B, c *cluster, w *watcher, i int) time.Duration {
				name := fmt.Sprintf("p%d", i)
				d := w.changeLatency(b, "added", func() { c.pod(name, ip, true, app("a")) }, ep)
				w.changeLatency(b, "deleted", func() { c.deletePod(name) })
				return d
			},
		},
		{
			name:  "pod deleted",
			setup: func(*cluster) {},
			step: func(b *testing.B, c *cluster, w *watcher, i int) time.Duration {
				name := fmt.Sprintf("p%d", i)
				w.changeLatency(b, "added", func() { c.pod(name, ip, true, app("a")) }, ep)
				return w.changeLatency(b, "deleted", func() { c.deletePod(name) })
			},
		},
		{
			name:  "pod relabelled out of the selector",
			setup: func(c *cluster) { c.pod("p", ip, true, app("a")) },
			step: func(b *testing.B, c *cluster, w *watcher, _ int) time.Duration {
				d := w.changeLatency(b, "out", func() { c.relabel("p", map[string]string{"app": "b"}) })
				w.changeLatency(b, "in", func() { c.relabel("p", map[string]string{"app": "a"}) }, ep)
				return d
			},
		},
		{
			name:  "pod relabelled into the selector",
			setup: func(c *cluster) { c.pod("p", ip, true, app("b")) },
			step: func(b *testing.B, c *cluster, w *watcher, _ int) time.Duration {
				d := w.changeLatency(b, "in", func() { c.relabel("p", map[string]string{"app": "a"}) }, ep)
				w.changeLatency(b, "out", func() { c.relabel("p", map[string]string{"app": "b"}) })
				return d
			},
		},
		{
			name: "pool selector changed (new Pod watch)",
			setup: func(c *cluster) {
				c.pod("p", ip, true, app("a"))
				c.pod("q", "127.0.0.2", true, app("b"))
			},
			step: func(b *testing.B, c *cluster, w *watcher, _ int) time.Duration {
				d := w.changeLatency(b, "to b", func() { c.setPool(map[string]string{"app": "b"}, 8000) }, "127.0.0.2:8000")
				w.changeLatency(b, "to a", func() { c.setPool(map[string]string{"app": "a"}, 8000) }, ep)
				return d
			},
		},
		{
			name:  "pool targetPorts 1 → 2 (data-parallel ranks)",
			setup: func(c *cluster) { c.pod("p", ip, true, app("a")) },
			step: func(b *testing.B, c *cluster, w *watcher, _ int) time.Duration {
				d := w.changeLatency(b, "2 ports", func() { c.setPool(map[string]string{"app": "a"}, 8000, 8001) }, ep, ip+":8001")
				w.changeLatency(b, "1 port", func() { c.setPool(map[string]string{"app": "a"}, 8000) }, ep)
				return d
			},
		},
	}
	for _, k := range kinds {
		b.Run(k.name, func(b *testing.B) {
			c := newCluster(b)
			c.setPool(map[string]string{"app": "a"}, 8000)
			k.setup(c)
			w := c.watch(watchOpts{})
			w.u.waitWithin(b, 10*time.Second, "initial set", func([]endpoint.Endpoint) bool { return true })
			var lat []time.Duration
			i := 0
			for b.Loop() {
				lat = append(lat, k.step(b, c, w, i))
				i++
			}
			slices.Sort(lat)
			ms := func(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }
			b.ReportMetric(ms(lat[len(lat)/2]), "p50-ms")
			b.ReportMetric(ms(lat[len(lat)-1]), "max-ms")
			b.ReportMetric(0, "ns/op")
			if lat[len(lat)-1] >= time.Second {
				b.Errorf("a change took %s to reach the endpoint set (max 1 s)", lat[len(lat)-1])
			}
		})
	}
}
