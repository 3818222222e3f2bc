package proof

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"math"
	"os"
	"sort"
	"sync"
	"time"

	"github.com/omnious/provider-node/capacity"
)

// windowRecord is one line of a windows file: a scrape window a replica's
// capacity curve learnt from, or (Snapshot set) the moment the proof saved
// snapshot-Snapshot.json, so that a replay can stop where a quote was read.
type windowRecord struct {
	Seconds  float64          `json:"t"` // since the recorder started
	Addr     string           `json:"addr,omitempty"`
	Window   *capacity.Window `json:"w,omitempty"`
	Snapshot *int             `json:"snapshot,omitempty"`
}

// windowRecorder writes what the EPP's capacity curves learn from, one
// JSON record a line, in the order the scraper gave it.
type windowRecorder struct {
	mu    sync.Mutex
	f     *os.File
	w     *bufio.Writer
	enc   *json.Encoder
	start time.Time
	err   error
}

func newWindowRecorder(path string) (*windowRecorder, error) {
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("cannot record windows: %w", err)
	}
	w := bufio.NewWriter(f)
	return &windowRecorder{f: f, w: w, enc: json.NewEncoder(w), start: time.Now()}, nil
}

func (r *windowRecorder) write(rec windowRecord) {
	r.mu.Lock()
	defer r.mu.Unlock()
	rec.Seconds = time.Since(r.start).Seconds()
	if r.err == nil {
		r.err = r.enc.Encode(rec)
	}
}

func (r *windowRecorder) window(addr string, w capacity.Window) {
	r.write(windowRecord{Addr: addr, Window: &w})
}

func (r *windowRecorder) snapshot(n int) { r.write(windowRecord{Snapshot: &n}) }

// Close flushes and closes the file, reporting the first write error.
func (r *windowRecorder) Close() error {
	r.mu.Lock()
	defer r.mu.Unlock()
	err := r.err
	if err == nil {
		err = r.w.Flush()
	}
	if cerr := r.f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("recording windows: %w", err)
	}
	return nil
}

// WindowSpan is a stretch of a windows file, in seconds since its
// recorder started: [From, To), To 0 meaning to the end.
type WindowSpan struct{ From, To float64 }

func (s WindowSpan) holds(t float64) bool { return t >= s.From && (s.To == 0 || t < s.To) }

// WindowLoad is what the engines did at one load (requests in an engine,
// running or waiting, rounded down) over the windows of a span: summed
// over windows and replicas.
type WindowLoad struct {
	Load    int
	Seconds float64
	// ITLWithin is the share of inter-token latencies within the
	// objective; NewTokensPerSec, OutputTokensPerSec and PromptTokensPerSec
	// are the token rates over the windows' time.
	ITLWithin          float64
	NewTokensPerSec    float64
	OutputTokensPerSec float64
	PromptTokensPerSec float64
	// Queued is the share of Seconds in windows with a prompt waiting
	// (their mean waiting count, or the smaller of their two ends', 1 or
	// more), and ITLWithinQueued and ITLWithinFree the shares within the
	// objective in those windows and in the rest (1 when they hold no
	// inter-token latency). A prompt waits while a long chunk of another's
	// prefill holds every decode, so the two kinds differ far more than
	// one load from the next, and a fleet's open ladder and its closed
	// loops spent different shares of their time at one load queued.
	Queued          float64
	ITLWithinQueued float64
	ITLWithinFree   float64
	// Rising and Falling are the shares of Seconds in windows whose load
	// was more than one request above or below the same replica's
	// TrendSpan before, and ITLWithinRising and ITLWithinFalling the
	// shares within the objective in them (1 when they hold none). Load
	// that rises came as prompts, whose prefill stalls the decodes; load
	// that falls left as answers ended, and nothing new is prefilled. So
	// one load reads differently by where it is going, and arrivals and a
	// client's closed loops pass it going different ways
	// (docs/notebook/history/proofs.md, "Where the load is going";
	// TestReadWindows keeps the split).
	Rising, Falling                   float64
	ITLWithinRising, ITLWithinFalling float64
}

// TrendSpan is how far back a window's load is compared with the same
// replica's to say whether it rose or fell (WindowLoad.Rising): several
// scrapes, and short against a request's time in the engine.
const TrendSpan = 2.0

// PrefixHitRate is the share of the prompt tokens the engines found
// cached, 0 when no prompt came.
func (l WindowLoad) PrefixHitRate() float64 {
	if l.PromptTokensPerSec <= 0 {
		return 0
	}
	return max(1-l.NewTokensPerSec/l.PromptTokensPerSec, 0)
}

// WindowMark is where the proof saved snapshot-Snapshot.json.
type WindowMark struct {
	Seconds  float64
	Snapshot int
}

// WindowStats is a windows file read back: the marks, the fleet's load
// (summed over replicas, each replica's last window) every Every seconds
// when Every is set, per span the loads its windows ran at, ascending, and
// the curves replayed.
type WindowStats struct {
	Marks  []WindowMark
	Series [][2]float64 // seconds, load
	Loads  [][]WindowLoad
	// Curves are the replayed curves by replica address (WindowQuery.ReplayTo).
	Curves map[string]capacity.Curve
}

// WindowQuery is what ReadWindows reads from a windows file.
type WindowQuery struct {
	// Spans are summed by load, their inter-token latencies counted
	// against ITL.
	Spans []WindowSpan
	ITL   time.Duration
	// Every, when above 0, samples the fleet's load every Every seconds.
	Every float64
	// ReplayTo, when set, feeds every window before the mark of
	// snapshot-ReplayTo.json to a capacity.Learner per replica that
	// forgets with HalfLife, as the EPP's curves learnt them
	// (WindowStats.Curves).
	ReplayTo *int
	HalfLife time.Duration
}

// ReadWindows reads a windows file (Options.RecordWindows) as q
// asks. A line that does not parse ends the reading with an error naming
// it.
func ReadWindows(r io.Reader, q WindowQuery) (*WindowStats, error) {
	spans, itl, every := q.Spans, q.ITL, q.Every
	var learners map[string]*capacity.Learner
	replaying := q.ReplayTo != nil
	if replaying {
		learners = make(map[string]*capacity.Learner)
	}
	type acc struct {
		all, queued, rising, falling itlTime // queued: windows with a prompt waiting
		newTok, out, prompt          float64
	}
	accs := make([]map[int]*acc, len(spans))
	for i := range accs {
		accs[i] = make(map[int]*acc)
	}
	st := &WindowStats{}
	last := make(map[string]float64)
	trends := make(map[string]*loadTrend)
	next := 0.0
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for line := 1; sc.Scan(); line++ {
		var rec windowRecord
		if err := json.Unmarshal(sc.Bytes(), &rec); err != nil {
			return nil, fmt.Errorf("windows line %d: %w", line, err)
		}
		if rec.Snapshot != nil {
			st.Marks = append(st.Marks, WindowMark{Seconds: rec.Seconds, Snapshot: *rec.Snapshot})
			if replaying && *rec.Snapshot == *q.ReplayTo {
				replaying = false
			}
			continue
		}
		w := rec.Window
		if w == nil {
			return nil, fmt.Errorf("windows line %d: neither a window nor a mark", line)
		}
		if replaying {
			l := learners[rec.Addr]
			if l == nil {
				l = capacity.NewLearner(q.HalfLife)
				learners[rec.Addr] = l
			}
			l.Add(*w)
		}
		load := w.Running + w.Waiting
		if every > 0 {
			last[rec.Addr] = load
			if rec.Seconds >= next {
				var sum float64
				for _, v := range last {
					sum += v
				}
				st.Series = append(st.Series, [2]float64{rec.Seconds, sum})
				next = rec.Seconds + every
			}
		}
		tr := trends[rec.Addr]
		if tr == nil {
			tr = &loadTrend{}
			trends[rec.Addr] = tr
		}
		change, known := tr.add(rec.Seconds, load)
		if !(w.Seconds > 0) || !(load > 0) || math.IsInf(load, 0) || math.IsInf(w.Seconds, 0) {
			continue
		}
		for i, s := range spans {
			if !s.holds(rec.Seconds) {
				continue
			}
			a := accs[i][int(load)]
			if a == nil {
				a = &acc{}
				accs[i][int(load)] = a
			}
			x := itlTime{sec: w.Seconds, within: w.ITL.Within(w.ITLBounds, itl.Seconds()) * w.ITL.Count, count: w.ITL.Count}
			a.all.add(x)
			if w.Waiting >= 1 || w.WaitingMin >= 1 {
				a.queued.add(x)
			}
			switch {
			case known && change > 1:
				a.rising.add(x)
			case known && change < -1:
				a.falling.add(x)
			}
			a.newTok += w.NewPromptTokensPerSec * w.Seconds
			a.out += w.OutputTokensPerSec * w.Seconds
			a.prompt += w.PromptTokensPerSec * w.Seconds
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("reading windows: %w", err)
	}
	if q.ReplayTo != nil {
		if replaying {
			return nil, fmt.Errorf("windows file has no mark for snapshot-%d.json", *q.ReplayTo)
		}
		st.Curves = make(map[string]capacity.Curve, len(learners))
		for addr, l := range learners {
			st.Curves[addr] = l.Curve()
		}
	}
	for _, m := range accs {
		loads := make([]WindowLoad, 0, len(m))
		for k, a := range m {
			sec := a.all.sec
			free := itlTime{within: a.all.within - a.queued.within, count: a.all.count - a.queued.count}
			l := WindowLoad{Load: k, Seconds: sec, NewTokensPerSec: a.newTok / sec,
				OutputTokensPerSec: a.out / sec, PromptTokensPerSec: a.prompt / sec,
				Queued: a.queued.sec / sec, ITLWithin: a.all.share(),
				ITLWithinQueued: a.queued.share(), ITLWithinFree: free.share(),
				Rising: a.rising.sec / sec, Falling: a.falling.sec / sec,
				ITLWithinRising: a.rising.share(), ITLWithinFalling: a.falling.share()}
			loads = append(loads, l)
		}
		sort.Slice(loads, func(i, j int) bool { return loads[i].Load < loads[j].Load })
		st.Loads = append(st.Loads, loads)
	}
	return st, nil
}

// itlTime is windows' time and their inter-token latencies, all of them
// and those within the objective, summed.
type itlTime struct{ sec, within, count float64 }

func (a *itlTime) add(x itlTime) {
	a.sec += x.sec
	a.within += x.within
	a.count += x.count
}

// share is the share within the objective, 1 when there is nothing to
// count.
func (a itlTime) share() float64 {
	if a.count > 0 {
		return a.within / a.count
	}
	return 1
}

// loadTrend is one replica's recent loads, oldest first, to compare a
// window's with the load TrendSpan before.
type loadTrend struct{ t, load []float64 }

// add records load at t and returns how far it moved since the last load
// recorded at least TrendSpan before, and whether there is one.
func (tr *loadTrend) add(t, load float64) (change float64, known bool) {
	tr.t, tr.load = append(tr.t, t), append(tr.load, load)
	i := sort.SearchFloat64s(tr.t, t-TrendSpan+1e-9) - 1 // the last at or before t-TrendSpan
	if i < 0 {
		return 0, false
	}
	change = load - tr.load[i]
	tr.t, tr.load = tr.t[i:], tr.load[i:]
	return change, true
}
