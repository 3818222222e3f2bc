package load

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/omnious/provider-node/bench/internal/launch"
	"github.com/omnious/provider-node/bench/internal/promtext"
)

// clockTicks is Linux's USER_HZ, the unit of /proc/stat CPU times (100 on
// every mainstream architecture).
const clockTicks = 100

// routeMetric is the EPP's own share of the added latency: from the
// message that completed the request to the routing reply.
const routeMetric = "omnious_extproc_route_duration_seconds"

// lagMetric is the EPP's KV-event apply lag, engine timestamp to index.
const lagMetric = "omnious_epp_kv_event_apply_lag_seconds"

// memory reads the EPP's Go heap in use and resident set from its /metrics.
func memory(ctx context.Context, e *launch.EPP) (heap, rss float64, err error) {
	vals, err := scrape(ctx, e, "go_memstats_heap_inuse_bytes", "process_resident_memory_bytes")
	if err != nil {
		return 0, 0, err
	}
	return vals[0], vals[1], nil
}

// counter sums the series of a metric in the EPP's /metrics.
func counter(ctx context.Context, e *launch.EPP, name string) (float64, error) {
	vals, err := scrape(ctx, e, name)
	if err != nil {
		return 0, err
	}
	return vals[0], nil
}

// scrape reads the EPP's /metrics and sums each named metric's series.
func scrape(ctx context.Context, e *launch.EPP, names ...string) ([]float64, error) {
	page, err := e.Metrics(ctx)
	if err != nil {
		return nil, err
	}
	return promtext.Values(page, names...)
}

// hostBusy is the machine's busy (non-idle, non-iowait) CPU time summed
// over its CPUs, from /proc/stat.
func hostBusy() (time.Duration, error) {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return 0, fmt.Errorf("cannot read host CPU time: %w", err)
	}
	defer f.Close()
	line, err := bufio.NewReader(f).ReadString('\n')
	if err != nil {
		return 0, fmt.Errorf("cannot read host CPU time: %w", err)
	}
	fields := strings.Fields(line)
	if len(fields) < 5 || fields[0] != "cpu" {
		return 0, errors.New("cannot parse /proc/stat")
	}
	var busy int64
	for i, s := range fields[1:] {
		if i == 3 || i == 4 { // idle, iowait
			continue
		}
		if i >= 7 { // guest time is already counted in user
			break
		}
		v, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("cannot parse /proc/stat: %w", err)
		}
		busy += v
	}
	return time.Duration(busy) * time.Second / clockTicks, nil
}
