package rig

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"math"
	"net"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"time"

	"go.uber.org/zap"

	"github.com/omnious/provider-node/bench/internal/launch"
	"github.com/omnious/provider-node/bench/internal/promtext"
	"github.com/omnious/provider-node/endpoint"
	"github.com/omnious/provider-node/extproc/testgw"
)

// Policies that name an EndpointPicker the bench does not assemble: it
// puts the same gateway, fleet and workload in front of it.
const (
	// PolicyExec starts one from a shell command: exec:[LABEL=]COMMAND,
	// with the placeholders of launch.Placeholders substituted.
	PolicyExec = "exec:"
	// PolicyAddr races one already running (and configured for the fleet):
	// addr:[LABEL=]HOST:PORT[+METRICS_HOST:PORT], loopback only.
	PolicyAddr = "addr:"
)

// Policy kinds, as the report names them.
const (
	KindPolicy = "policy" // a built-in policy name, run by the EPP in process
	KindConfig = "config" // an EPP config file, run by the EPP in process
	KindExec   = "exec"
	KindAddr   = "addr"
)

// DefaultExternalSettle is how long the bench waits after an external EPP
// answers SERVING before it sends traffic: its discovery, scrapes and
// KV-event subscriptions start in the background, and the bench cannot ask
// an EPP it did not build when they are done.
const DefaultExternalSettle = 2 * time.Second

// externalWait bounds the wait for an external EPP's gRPC health.
const externalWait = 60 * time.Second

// labelRE is what an exec:/addr: label may be: one word, no path.
var labelRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._:-]*$`)

// external is a parsed exec: or addr: policy.
type external struct {
	kind  string // KindExec or KindAddr
	label string
	// command is the exec: shell command.
	command string
	// addr and metrics are the addr: EPP's ext_proc and metrics addresses.
	addr, metrics string
}

// parseExternal parses policy when it is an exec: or addr: policy; ok is
// false for any other policy.
func parseExternal(policy string) (x external, ok bool, err error) {
	var rest string
	switch {
	case strings.HasPrefix(policy, PolicyExec):
		x.kind, rest = KindExec, policy[len(PolicyExec):]
	case strings.HasPrefix(policy, PolicyAddr):
		x.kind, rest = KindAddr, policy[len(PolicyAddr):]
	default:
		return x, false, nil
	}
	if l, r, found := strings.Cut(rest, "="); found && labelRE.MatchString(l) {
		x.label, rest = l, r
	}
	rest = strings.TrimSpace(rest)
	if x.kind == KindExec {
		if rest == "" {
			return x, true, fmt.Errorf("policy %q: exec: needs a command", policy)
		}
		x.command = rest
		if x.label == "" {
			x.label = PolicyExec + filepath.Base(strings.Fields(rest)[0])
		}
		return x, true, nil
	}
	x.addr, x.metrics, _ = strings.Cut(rest, "+")
	if err := requireLoopback(x.addr); err != nil {
		return x, true, fmt.Errorf("policy %q: %w", policy, err)
	}
	if x.metrics != "" {
		if err := requireLoopback(x.metrics); err != nil {
			return x, true, fmt.Errorf("policy %q: metrics %w", policy, err)
		}
	}
	if x.label == "" {
		x.label = PolicyAddr + x.addr
	}
	return x, true, nil
}

// requireLoopback accepts host:port on 127.0.0.0/8, ::1 or localhost: the
// bench sends traffic nowhere else.
func requireLoopback(hostport string) error {
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		return fmt.Errorf("address %q: want host:port", hostport)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		return fmt.Errorf("address %q: bad port", hostport)
	}
	if !isLoopbackHost(host) {
		return fmt.Errorf("address %q is not on loopback", hostport)
	}
	return nil
}

// isLoopbackHost reports whether host is localhost or a loopback IP.
func isLoopbackHost(host string) bool {
	ip := net.ParseIP(host)
	return host == "localhost" || ip != nil && ip.IsLoopback()
}

// ValidatePolicy checks an exec: or addr: policy (any other is accepted
// here: the launcher reads a config file when it starts it): malformed is
// what is wrong with its text, misplaced why it cannot race on a fleet of
// fleetMode.
func ValidatePolicy(policy, fleetMode string) (malformed, misplaced error) {
	x, ext, err := parseExternal(policy)
	if err != nil {
		return err, nil
	}
	if ext && x.kind == KindAddr && fleetMode != FleetURLs {
		return nil, fmt.Errorf("policy %q: an EPP already running routes to the endpoints it was given, "+
			"but a simulated fleet starts afresh, on new ports, for each policy: race it with -urls on a fleet you started, or start it with exec:", policy)
	}
	return nil, nil
}

// PolicyLabel is how a policy is named in the results: an exec:/addr:
// policy by its label, any other by itself.
func PolicyLabel(policy string) string {
	if x, ok, err := parseExternal(policy); ok && err == nil {
		return x.label
	}
	return policy
}

// PolicyKind is how a policy is run (KindPolicy, KindConfig, KindExec or
// KindAddr).
func PolicyKind(policy string) string {
	switch {
	case strings.HasPrefix(policy, PolicyExec):
		return KindExec
	case strings.HasPrefix(policy, PolicyAddr):
		return KindAddr
	case IsPolicyName(policy):
		return KindPolicy
	}
	return KindConfig
}

// dirName turns a label into a directory name.
func dirName(label string) string {
	return strings.Map(func(r rune) rune {
		if r == ':' || r == '/' || r == '\\' {
			return '-'
		}
		return r
	}, label)
}

// EPPInfo is what the bench knows about an external EPP's run besides what
// the gateway and the engines measure: where it ran, what its own metrics
// said.
type EPPInfo struct {
	// Addr is its ext_proc address.
	Addr string
	// Log is an exec: EPP's output (stdout and stderr); its directory holds
	// the endpoint files and the command as run.
	Log string
	// MetricsURL is where it was scraped ("" when not known); MetricsError
	// why the scrape failed.
	MetricsURL, MetricsError string
	// DecisionHistogram is the histogram the decision percentiles were read
	// from (bucket-interpolated), "" when it exposes none the bench knows.
	DecisionHistogram string
	// KVEventsBind is the socket it bound for the fleet's KV events
	// ({kv_events_bind}; "" when none), and KVBatchesRelayed how many
	// batches the bench relayed to it.
	KVEventsBind     string
	KVBatchesRelayed int64
	// Requests is what its request counter (RequestsCounter) grew by during
	// the run; NaN when unknown.
	Requests        float64
	RequestsCounter string
	decP50, decP99  float64 // µs, NaN when unknown
}

// DecisionPercentiles are the p50 and p99 of its scheduling decisions over
// the run, in µs, read from DecisionHistogram; NaN when unknown.
func (e *EPPInfo) DecisionPercentiles() (p50, p99 float64) { return e.decP50, e.decP99 }

// decisionHistograms are the scheduling-latency histograms the bench knows,
// first match wins: this project's EPP (routing share, flow control
// included), llm-d-router's and the Inference Extension's scheduler.
var decisionHistograms = []string{"omnious_extproc_route_duration_seconds",
	"llm_d_epp_scheduler_e2e_duration_seconds", "inference_extension_scheduler_e2e_duration_seconds"}

// requestCounters are the routed-request counters the bench knows: the
// Inference Extension's (this project's EPP serves it too) and llm-d-router's.
var requestCounters = []string{"inference_objective_request_total", "llm_d_epp_request_total"}

// launchExternal starts (exec:) or attaches to (addr:) an external EPP,
// waits for its gRPC health and the settle time, and puts the test gateway
// in front of it. An exec: EPP runs as n processes side by side, each
// with its own ports, directory (LABEL/1 .. LABEL/n when n > 1) and KV
// relay, behind the one gateway; an addr: EPP is the one it names.
func launchExternal(ctx context.Context, x external, fleet []endpoint.Endpoint, dir string, settle time.Duration, n int, log *zap.Logger) (Target, error) {
	t := &externalTarget{}
	if x.kind != KindExec {
		n = 1
	}
	var addrs []string
	for i := range max(n, 1) {
		m := &externalEPP{}
		if x.kind == KindExec {
			d := filepath.Join(dir, dirName(x.label))
			if n > 1 {
				d = filepath.Join(d, strconv.Itoa(i+1))
			}
			var err error
			if m.epp, err = launch.StartExternal(launch.ExternalConfig{Command: x.command, Dir: d, Name: x.label, Endpoints: fleet}); err != nil {
				return nil, errors.Join(err, t.stopEPPs())
			}
			m.log = m.epp.LogPath()
		} else {
			m.epp = launch.Attach(x.label, x.addr, x.metrics)
		}
		t.members = append(t.members, m)
		if err := m.epp.WaitServing(ctx, externalWait); err != nil {
			return nil, errors.Join(err, t.stopEPPs())
		}
		if bind := m.epp.KVEventsBind(); bind != "" {
			var err error
			if m.relay, err = launch.StartKVRelay(fleet, bind); err != nil {
				return nil, errors.Join(err, t.stopEPPs())
			}
		}
		addrs = append(addrs, m.epp.GRPCAddr())
	}
	select {
	case <-time.After(settle):
	case <-ctx.Done():
		return nil, errors.Join(ctx.Err(), t.stopEPPs())
	}
	for _, m := range t.members {
		// A page that cannot be read now counts as zeros: every counter of
		// a fresh EPP starts there.
		m.before, _ = m.scrape(ctx)
	}
	var err error
	if t.gw, err = launch.StartGateway(testgw.Config{EPPs: addrs}, log); err != nil {
		return nil, errors.Join(err, t.stopEPPs())
	}
	return t, nil
}

// externalTarget is an external EPP, one or more processes, behind the
// test gateway.
type externalTarget struct {
	members []*externalEPP
	gw      *launch.Gateway
}

// externalEPP is one of them.
type externalEPP struct {
	epp    *launch.EPP
	relay  *launch.KVRelay // nil unless the EPP binds for KV events
	before []byte          // its metrics page after start-up (nil: none, or unreadable)
	log    string          // an exec: EPP's output
}

func (t *externalTarget) URL() string { return t.gw.URL() }

// EPPCount is how many EPP processes serve the policy.
func (t *externalTarget) EPPCount() int { return len(t.members) }

// DecisionLatencies are not observable from outside the EPP: its own
// histogram, if any, stands in (Info).
func (t *externalTarget) DecisionLatencies() []time.Duration { return nil }

func (t *externalTarget) Close() error { return errors.Join(t.gw.Close(), t.stopEPPs()) }

// stopEPPs stops each member's relay, then the member (an addr: EPP is
// not the bench's to stop: its Stop does nothing).
func (t *externalTarget) stopEPPs() error {
	var errs []error
	for _, m := range t.members {
		if m.relay != nil {
			errs = append(errs, m.relay.Close())
		}
		errs = append(errs, m.epp.Stop())
	}
	return errors.Join(errs...)
}

// scrape reads the EPP's metrics page: nil without an error when its
// metrics are not known.
func (m *externalEPP) scrape(ctx context.Context) ([]byte, error) {
	if m.epp.MetricsURL() == "" {
		return nil, nil
	}
	r, err := m.epp.Metrics(ctx)
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	_, err = b.ReadFrom(r)
	return b.Bytes(), err
}

// Metrics scrapes every member's metrics page, in start order (nil for a
// member whose metrics address is not known).
func (t *externalTarget) Metrics(ctx context.Context) ([][]byte, error) {
	var pages [][]byte
	for _, m := range t.members {
		b, err := m.scrape(ctx)
		if err != nil {
			return pages, err
		}
		pages = append(pages, b)
	}
	return pages, nil
}

// Info scrapes every member once more and reads what the run changed
// in the metrics the bench knows, summed over the members; addresses,
// logs and metrics URLs are listed comma-separated.
func (t *externalTarget) Info(ctx context.Context) *EPPInfo {
	info := EPPInfo{Requests: math.NaN(), decP50: math.NaN(), decP99: math.NaN()}
	var addrs, logs, urls, binds, errs []string
	afters := make([][]byte, len(t.members))
	for i, m := range t.members {
		addrs, logs = append(addrs, m.epp.GRPCAddr()), appendSet(logs, m.log)
		urls = appendSet(urls, m.epp.MetricsURL())
		if m.relay != nil {
			binds = append(binds, m.epp.KVEventsBind())
			info.KVBatchesRelayed += m.relay.Relayed()
		}
		var err error
		if afters[i], err = m.scrape(ctx); err != nil {
			errs = append(errs, err.Error())
		}
	}
	join := func(v []string) string { return strings.Join(v, ", ") }
	info.Addr, info.Log, info.MetricsURL, info.KVEventsBind, info.MetricsError = join(addrs), join(logs), join(urls), join(binds), join(errs)
	for _, name := range requestCounters {
		total, seen := 0.0, false
		for i, m := range t.members {
			if afters[i] == nil {
				continue
			}
			a, ok, err := promtext.Sum(bytes.NewReader(afters[i]), name)
			if err != nil || !ok[0] {
				continue
			}
			b, _, _ := promtext.Sum(bytes.NewReader(m.before), name)
			total, seen = total+a[0]-b[0], true
		}
		if seen {
			info.Requests, info.RequestsCounter = total, name
			break
		}
	}
	for _, name := range decisionHistograms {
		var before, after []promtext.Bucket
		for i, m := range t.members {
			if afters[i] == nil {
				continue
			}
			a, err := promtext.Buckets(bytes.NewReader(afters[i]), name)
			if err != nil || after != nil && !slices.EqualFunc(a, after, sameLE) {
				continue
			}
			b, err := promtext.Buckets(bytes.NewReader(m.before), name)
			if err != nil || !slices.EqualFunc(a, b, sameLE) {
				// Not observed yet at start-up: a vector histogram has no
				// series before its first sample.
				b = make([]promtext.Bucket, len(a))
				for k := range a {
					b[k].LE = a[k].LE
				}
			}
			if after == nil {
				before, after = b, a
				continue
			}
			for k := range a {
				before[k].N += b[k].N
				after[k].N += a[k].N
			}
		}
		if after != nil {
			info.DecisionHistogram = name
			info.decP50 = promtext.Quantile(0.5, before, after) * 1e6
			info.decP99 = promtext.Quantile(0.99, before, after) * 1e6
			break
		}
	}
	return &info
}

// sameLE reports whether two buckets have the same bound.
func sameLE(a, b promtext.Bucket) bool { return a.LE == b.LE }

// appendSet appends v unless it is empty or already there.
func appendSet(s []string, v string) []string {
	if v == "" || slices.Contains(s, v) {
		return s
	}
	return append(s, v)
}
