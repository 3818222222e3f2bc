package epp

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strconv"
	"time"

	"go.uber.org/zap"

	"github.com/omnious/provider-node/internal/opt"
	"github.com/omnious/provider-node/kvindex"
)

// WarmStartConfig says where a starting EPP asks a running sibling for its
// index snapshot (GET /debug/index/snapshot on the sibling's admin port).
// With neither Peers nor PeerService the EPP starts cold: it learns from
// the engines' replay buffers and their events from then on.
type WarmStartConfig struct {
	// Peers are the siblings' admin addresses, host:port, asked in order
	// (bare metal). The EPP's own address may be listed: it is skipped.
	// Default none (-peers, comma-separated).
	Peers []string `yaml:"peers"`
	// PeerService is host:port of the siblings' headless Service (the
	// admin port): every address the name resolves to is a sibling, the
	// EPP's own skipped. Default "" (-peer-service).
	PeerService string `yaml:"peer_service"`
	// Timeout bounds the whole warm start: resolving, fetching and loading
	// the snapshot. Default 10s: a sibling following 1,024 engines of
	// full caches (18 M blocks) encodes for about 4 CPU seconds while this
	// EPP loads for about 4.5 (kvindex BenchmarkSnapshotLoad and
	// BenchmarkSnapshotWrite, docs/scale.md), which left 5s no margin.
	Timeout time.Duration `yaml:"timeout"`
	// MaxBytes bounds a snapshot read; a larger one is refused. Default 1 GiB.
	MaxBytes int64 `yaml:"max_bytes"`
}

// Defaults of WarmStartConfig.
const (
	defaultWarmTimeout  = 10 * time.Second
	defaultWarmMaxBytes = 1 << 30
)

// WithDefaults returns c with every unset field at its default.
func (c WarmStartConfig) WithDefaults() WarmStartConfig {
	opt.Zero(&c.Timeout, defaultWarmTimeout)
	opt.Zero(&c.MaxBytes, defaultWarmMaxBytes)
	return c
}

func (c WarmStartConfig) validate() error {
	var errs []error
	for _, p := range c.Peers {
		if _, _, err := net.SplitHostPort(p); err != nil {
			errs = append(errs, fmt.Errorf("warm_start.peers: %q is not host:port", p))
		}
	}
	if c.PeerService != "" {
		if _, _, err := net.SplitHostPort(c.PeerService); err != nil {
			errs = append(errs, fmt.Errorf("warm_start.peer_service: %q is not host:port", c.PeerService))
		}
	}
	errs = append(errs, opt.DefaultNonNegative("warm_start.timeout", c.Timeout, defaultWarmTimeout),
		opt.DefaultNonNegative("warm_start.max_bytes", c.MaxBytes, defaultWarmMaxBytes))
	return errors.Join(errs...)
}

// pool names what the EPP serves in snapshot headers: a sibling of another
// pool is foreign.
func (c Config) pool() string {
	if c.PoolName == "" {
		return ""
	}
	return c.PoolNamespace + "/" + c.PoolName
}

// warmStart loads a sibling's snapshot into a fresh index, or returns nil
// (no sibling, or none gave a snapshot that loads whole): the EPP then
// starts cold.
func (e *EPP) warmStart() *kvindex.Snapshot {
	ws := e.cfg.WarmStart
	if len(ws.Peers) == 0 && ws.PeerService == "" {
		return nil
	}
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), ws.Timeout)
	defer cancel()
	peers, err := e.siblings(ctx)
	if err != nil {
		e.log.Warn("warm start: cannot resolve the siblings; starting cold", zap.String("peer_service", ws.PeerService), zap.Error(err))
	}
	if len(peers) == 0 {
		e.log.Info("warm start: no sibling EPP to ask; starting cold, from the engines' replay buffers")
		return nil
	}
	// A sibling that does not answer within a second is passed over, so
	// the others are asked within the timeout.
	// Siblings are asked with this EPP's own admin credentials.
	dialer := &net.Dialer{Timeout: min(time.Second, ws.Timeout)}
	creds := e.cfg.Admin.auth().Client()
	rt, err := creds.Transport(&http.Transport{Proxy: nil, DialContext: dialer.DialContext,
		ResponseHeaderTimeout: min(time.Second, ws.Timeout), DisableCompression: true})
	if err != nil {
		e.log.Warn("warm start: cannot load the admin credentials; starting cold", zap.Error(err))
		return nil
	}
	client := &http.Client{Transport: rt}
	defer client.CloseIdleConnections()
	for _, p := range peers {
		snap, err := e.fetchSnapshot(ctx, client, creds.Scheme(), p)
		if err != nil {
			e.log.Warn("warm start: index snapshot refused", zap.String("peer", p), zap.Error(err))
			continue
		}
		e.log.Info("warm start: index loaded from a sibling", zap.String("peer", p), zap.Int("replicas", len(snap.Replicas)),
			zap.Int("blocks", snap.Blocks), zap.Int64("bytes", snap.Bytes), zap.Duration("took", time.Since(start)))
		return snap
	}
	e.log.Warn("warm start: no sibling gave a usable snapshot; starting cold, from the engines' replay buffers", zap.Int("asked", len(peers)))
	return nil
}

// fetchSnapshot streams a sibling's snapshot into a fresh index.
func (e *EPP) fetchSnapshot(ctx context.Context, client *http.Client, scheme, peer string) (*kvindex.Snapshot, error) {
	url := fmt.Sprintf("%s://%s%s?%s=%d", scheme, peer, kvindex.SnapshotPath, kvindex.SnapshotVersionParam, kvindex.SnapshotVersion)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, fmt.Errorf("cannot ask %s: %w", peer, err)
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("cannot ask %s: %w", peer, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s answered %s", peer, resp.Status)
	}
	snap, err := kvindex.LoadSnapshot(resp.Body, kvindex.LoadOptions{
		Index:    e.cfg.Index.kvindex(),
		Want:     e.snapshotHeader(),
		MaxBytes: e.cfg.WarmStart.MaxBytes,
		Assign:   e.ids.Assign,
	})
	if err != nil && ctx.Err() != nil {
		err = fmt.Errorf("%w (warm_start.timeout %v)", err, e.cfg.WarmStart.Timeout)
	}
	return snap, err
}

func (e *EPP) snapshotHeader() kvindex.SnapshotHeader {
	return kvindex.SnapshotHeader{BlockSize: e.cfg.Scheduler.BlockSize, Pool: e.cfg.pool()}
}

// siblings lists the admin addresses to ask: the configured peers, then
// the addresses PeerService resolves to, without duplicates and without
// the EPP itself (an address of this host on the EPP's own admin port).
func (e *EPP) siblings(ctx context.Context) ([]string, error) {
	ws := e.cfg.WarmStart
	self := selfCheck(e.cfg.AdminAddr)
	seen := map[string]bool{}
	var out []string
	add := func(hostport string) {
		if !seen[hostport] && !self(hostport) {
			seen[hostport] = true
			out = append(out, hostport)
		}
	}
	for _, p := range ws.Peers {
		add(p)
	}
	if ws.PeerService == "" {
		return out, nil
	}
	host, port, err := net.SplitHostPort(ws.PeerService)
	if err != nil {
		return out, err
	}
	addrs, err := net.DefaultResolver.LookupIPAddr(ctx, host)
	var dnsErr *net.DNSError
	if errors.As(err, &dnsErr) && dnsErr.IsNotFound {
		// A headless Service without ready Pods has no name: no sibling.
		return out, nil
	}
	if err != nil {
		return out, err
	}
	for _, a := range addrs {
		add(net.JoinHostPort(a.IP.String(), port))
	}
	return out, nil
}

// selfCheck returns whether an address is this EPP's admin address: the
// admin port on an address of this host (or a loopback or unspecified one).
func selfCheck(adminAddr string) func(string) bool {
	_, ownPort, _ := net.SplitHostPort(adminAddr)
	local := map[string]bool{}
	if addrs, err := net.InterfaceAddrs(); err == nil {
		for _, a := range addrs {
			if ipn, ok := a.(*net.IPNet); ok {
				local[ipn.IP.String()] = true
			}
		}
	}
	return func(hostport string) bool {
		host, port, err := net.SplitHostPort(hostport)
		if err != nil || port != ownPort || ownPort == "0" {
			return false
		}
		if host == "localhost" {
			return true
		}
		ip := net.ParseIP(host)
		return ip != nil && (local[ip.String()] || ip.IsLoopback() || ip.IsUnspecified())
	}
}

// serveSnapshot streams the index snapshot: one at a time (another request
// meanwhile gets 503), each replica encoded while its ingestion waits, then
// written without holding it, in the newest format the reader names
// (kvindex.SnapshotVersionParam; version 1 when it names none).
func (e *EPP) serveSnapshot(w http.ResponseWriter, r *http.Request) {
	version := 1
	if v := r.URL.Query().Get(kvindex.SnapshotVersionParam); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 {
			http.Error(w, "snapshot version: want a positive integer", http.StatusBadRequest)
			return
		}
		version = min(n, kvindex.SnapshotVersion)
	}
	if !e.snapMu.TryLock() {
		w.Header().Set("Retry-After", "1")
		http.Error(w, "an index snapshot is being served; retry", http.StatusServiceUnavailable)
		return
	}
	defer e.snapMu.Unlock()
	start := time.Now()
	w.Header().Set("Content-Type", "application/octet-stream")
	sw, err := kvindex.NewSnapshotWriterVersion(w, e.snapshotHeader(), version)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	// The header goes out at once: the sibling's response timeout does
	// not wait for the first replica's encoding.
	err = sw.Flush()
	if err == nil {
		_ = http.NewResponseController(w).Flush()
		err = e.ingest.WriteSnapshot(sw)
	}
	if err == nil {
		err = sw.Close()
	}
	replicas, blocks, skipped := sw.Stats()
	if err != nil {
		// The stream stops without its trailer: the sibling refuses it.
		e.log.Warn("index snapshot not sent whole", zap.String("to", r.RemoteAddr), zap.Int("replicas", replicas), zap.Error(err))
		return
	}
	e.log.Info("index snapshot served", zap.String("to", r.RemoteAddr), zap.Int("replicas", replicas), zap.Int("blocks", blocks),
		zap.Int("skipped_orphans", skipped), zap.Duration("took", time.Since(start)))
}
