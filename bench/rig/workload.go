package rig

import (
	"bufio"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"sort"
	"strings"
	"time"
)

// TraceBlockSize is the Mooncake trace's block size in tokens: each hash id
// stands for 512 prompt tokens (the last one fewer, per input_length).
const TraceBlockSize = 512

// standInVocab bounds synthesised token ids below the stand-in tokenizer's
// special ids, so a synthesised prompt never contains a control token.
const standInVocab = 151643

// Request is one request of a workload.
type Request struct {
	// At is the arrival offset from the start of the run, in wall time.
	At time.Duration
	// Stage is the QPS-ladder stage (0 without a ladder).
	Stage int
	// Tokens is a token-id prompt for /v1/completions; Text is a text
	// prompt for /v1/completions when Tokens is nil.
	Tokens []uint32
	Text   string
	// MaxTokens is the exact output length (sent with ignore_eos).
	MaxTokens int
	// Session, when set, makes this request a whole chat session started at
	// At; Tokens and Text are unused.
	Session *Session
	// Agent, when set, makes this request a whole agent session started
	// at At; Tokens and Text are unused.
	Agent *AgentSession
}

// AgentSession is one tool-using agent's chain of calls.
type AgentSession struct {
	// ID is the session header's value ("" sends none).
	ID string
	// System and Tools are shared by every session; Task is the first
	// user message.
	System, Task string
	Tools        json.RawMessage
	// Results are the tools' results, one per call but the last, and
	// Gaps the wall-time tool time before each is sent.
	Results []string
	Gaps    []time.Duration
	// OutputLen is the final answer's max_tokens, ToolCallMax a tool
	// call's.
	OutputLen, ToolCallMax int
}

// Calls is how many calls the session makes.
func (a *AgentSession) Calls() int { return len(a.Results) + 1 }

// Session is one multi-turn conversation through /v1/chat/completions.
type Session struct {
	System string
	Users  []string
	// MaxTokens is each answer's output length (sent with ignore_eos).
	MaxTokens int
	// Think is the wall-time pause between an answer and the next turn.
	Think time.Duration
	Tools bool
}

// Stage is one step of a QPS ladder.
type Stage struct {
	// QPS is the arrival rate in model time.
	QPS float64
	// Start and End bound the stage's arrivals in wall time.
	Start, End time.Duration
	// Warmup stages are left out of the summary across stages.
	Warmup bool
}

// Workload is the traffic every policy receives, identical per seed.
type Workload struct {
	Name     string
	Requests []Request
	// Stages is the QPS ladder; one stage without a ladder.
	Stages []Stage
	// Bound is the infinite-cache hit rate in prompt tokens: the best any
	// router could do. NaN until known (chat: estimated after the first run).
	Bound     float64
	BoundNote string
	// MaxLen is the longest prompt plus output, in tokens.
	MaxLen int
	// Closed, when set, replays the agent sessions closed-loop; each
	// Request's At is then unused.
	Closed *ClosedLoop
	// ContextEnded is how many agent sessions end early because their
	// next call would not fit AgentOptions.MaxContext.
	ContextEnded int
	// pieces are each request's prompt as reusable pieces, in arrival
	// order, for the finite-cache bound; nil when unknown (chat).
	pieces [][]piece
}

// piece is a reusable run of prompt tokens: equal keys are equal content
// (including everything before it).
type piece struct {
	key uint64
	n   int
}

// LRUBound is the hit rate, in tokens, of one LRU cache of capacity tokens
// holding whole pieces: what a router that pooled the fleet's KV cache
// perfectly (every piece on exactly one replica, every request sent where its
// pieces are) could reach. A piece hits min(its tokens, the tokens cached
// under its key). NaN without pieces.
func (w *Workload) LRUBound(capacity int64) float64 {
	if w.pieces == nil {
		return math.NaN()
	}
	return lruBound(w.pieces, capacity)
}

func lruBound(reqs [][]piece, capacity int64) float64 {
	type entry struct {
		key        uint64
		n          int
		prev, next *entry
	}
	head := &entry{} // sentinel: head.next is the most recent
	head.prev, head.next = head, head
	unlink := func(e *entry) { e.prev.next, e.next.prev = e.next, e.prev }
	pushFront := func(e *entry) { e.next, e.prev = head.next, head; head.next.prev = e; head.next = e }
	cache := map[uint64]*entry{}
	var used, hits, total int64
	for _, r := range reqs {
		for _, p := range r {
			total += int64(p.n)
			if e, ok := cache[p.key]; ok {
				hits += int64(min(p.n, e.n))
				unlink(e)
				pushFront(e)
				if p.n > e.n {
					used += int64(p.n - e.n)
					e.n = p.n
				}
			} else {
				e := &entry{key: p.key, n: p.n}
				cache[p.key] = e
				pushFront(e)
				used += int64(p.n)
			}
			for used > capacity && head.prev != head {
				old := head.prev
				unlink(old)
				delete(cache, old.key)
				used -= int64(old.n)
			}
		}
	}
	if total == 0 {
		return 0
	}
	return float64(hits) / float64(total)
}

// TraceRecord is one line of a Mooncake-format trace.
type TraceRecord struct {
	Timestamp    int64   `json:"timestamp"` // ms from the trace start
	InputLength  int     `json:"input_length"`
	OutputLength int     `json:"output_length"`
	HashIDs      []int64 `json:"hash_ids"`
}

// ParseTrace reads a Mooncake JSONL trace (blank lines are skipped). Every
// record must have len(hash_ids) == ceil(input_length/512) and a positive
// output_length, so that the last block's size is well defined.
func ParseTrace(r io.Reader) ([]TraceRecord, error) {
	var out []TraceRecord
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 0, 1<<20), 64<<20)
	line := 0
	for sc.Scan() {
		line++
		b := sc.Bytes()
		if len(strings.TrimSpace(string(b))) == 0 {
			continue
		}
		var rec TraceRecord
		if err := json.Unmarshal(b, &rec); err != nil {
			return nil, fmt.Errorf("trace line %d: %w", line, err)
		}
		if err := rec.check(); err != nil {
			return nil, fmt.Errorf("trace line %d: %w", line, err)
		}
		out = append(out, rec)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("cannot read trace: %w", err)
	}
	if len(out) == 0 {
		return nil, errors.New("trace has no records")
	}
	return out, nil
}

func (r TraceRecord) check() error {
	switch {
	case r.InputLength < 1:
		return fmt.Errorf("input_length %d: want >= 1", r.InputLength)
	case r.OutputLength < 1:
		return fmt.Errorf("output_length %d: want >= 1", r.OutputLength)
	case r.Timestamp < 0:
		return fmt.Errorf("timestamp %d: want >= 0", r.Timestamp)
	case len(r.HashIDs) != (r.InputLength+TraceBlockSize-1)/TraceBlockSize:
		return fmt.Errorf("input_length %d needs %d hash ids, got %d", r.InputLength,
			(r.InputLength+TraceBlockSize-1)/TraceBlockSize, len(r.HashIDs))
	}
	return nil
}

// lastBlockLen is the token count of the record's last (possibly partial) block.
func (r TraceRecord) lastBlockLen() int {
	return r.InputLength - TraceBlockSize*(len(r.HashIDs)-1)
}

// TraceTokens synthesises the record's prompt: block i is the first n tokens
// of a sequence determined only by (seed, hash_ids[i]), n being 512 except
// for the last block (input_length - 512*(len-1)). Equal hash ids thus give
// equal token blocks, and a partial block is a prefix of the full one.
func TraceTokens(seed int64, r TraceRecord) []uint32 {
	out := make([]uint32, 0, r.InputLength)
	for i, id := range r.HashIDs {
		n := TraceBlockSize
		if i == len(r.HashIDs)-1 {
			n = r.lastBlockLen()
		}
		out = appendBlockTokens(out, seed, uint64(id), n)
	}
	return out
}

func appendBlockTokens(dst []uint32, seed int64, id uint64, n int) []uint32 {
	base := mix(uint64(seed)*0x9e3779b97f4a7c15 ^ mix(id+0x632be59bd9b4e019))
	for j := 0; j < n; j++ {
		dst = append(dst, uint32(mix(base+uint64(j))%standInVocab))
	}
	return dst
}

// TraceText is TraceTokens as text: one word per token, so that the
// stand-in tokenizer (and the simulator) sees exactly input_length tokens.
func TraceText(seed int64, r TraceRecord) string {
	var b strings.Builder
	b.Grow(r.InputLength * 6)
	for i, id := range r.HashIDs {
		n := TraceBlockSize
		if i == len(r.HashIDs)-1 {
			n = r.lastBlockLen()
		}
		base := mix(uint64(seed)*0x9e3779b97f4a7c15 ^ mix(uint64(id)+0x632be59bd9b4e019))
		for j := 0; j < n; j++ {
			writeWord(&b, mix(base+uint64(j)))
		}
	}
	return b.String()
}

// TraceBound is the infinite-cache hit rate of a trace in tokens: a block's
// tokens are hits when its hash id appeared earlier in the trace. A partial
// last block counts min(its tokens, the most tokens seen earlier under that
// id) as hits, since only that much of it can have been cached before.
func TraceBound(recs []TraceRecord) float64 {
	seen := make(map[int64]int)
	var hits, total int64
	for _, r := range recs {
		for i, id := range r.HashIDs {
			n := TraceBlockSize
			if i == len(r.HashIDs)-1 {
				n = r.lastBlockLen()
			}
			total += int64(n)
			prev := seen[id]
			hits += int64(min(n, prev))
			if n > prev {
				seen[id] = n
			}
		}
	}
	if total == 0 {
		return 0
	}
	return float64(hits) / float64(total)
}

// mix is the SplitMix64 finaliser: a cheap, well-spread hash of x.
func mix(x uint64) uint64 {
	x += 0x9e3779b97f4a7c15
	x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9
	x = (x ^ (x >> 27)) * 0x94d049bb133111eb
	return x ^ (x >> 31)
}

// writeWord writes " " and 3 to 6 lowercase letters chosen by x: the
// stand-in tokenizer reads a space plus up to six letters as one token.
func writeWord(b *strings.Builder, x uint64) {
	b.WriteByte(' ')
	n := 3 + int(x%4)
	x /= 4
	for i := 0; i < n; i++ {
		b.WriteByte(byte('a' + x%26))
		x /= 26
	}
}

// words returns n deterministic words for (seed, kind, a, b).
func words(seed int64, kind string, a, b, n int) string {
	var sb strings.Builder
	sb.Grow(n * 6)
	base := mix(uint64(seed) ^ mix(uint64(len(kind))<<56^uint64(kind[0])<<48^uint64(a)<<24^uint64(b)))
	for j := 0; j < n; j++ {
		writeWord(&sb, mix(base+uint64(j)))
	}
	return sb.String()
}

// ReadTrace reads a trace file's records, in file order.
func ReadTrace(path string) ([]TraceRecord, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("cannot open trace: %w", err)
	}
	defer f.Close()
	return ParseTrace(f)
}

// loadTrace builds the trace workload.
func loadTrace(o Options) (*Workload, error) {
	recs, err := ReadTrace(o.Workload.Trace.Path)
	if err != nil {
		return nil, err
	}
	t := o.Workload.Trace
	if t.Limit > 0 && t.Limit < len(recs) {
		recs = recs[:t.Limit]
	}
	sort.SliceStable(recs, func(i, j int) bool { return recs[i].Timestamp < recs[j].Timestamp })
	w := &Workload{Name: "mooncake trace " + t.Path, Bound: TraceBound(recs),
		BoundNote: "trace blocks of 512 tokens: a block is a hit if its hash id was seen earlier; a partial last block hits min(its tokens, the most tokens seen under that id)"}
	t0 := recs[0].Timestamp
	for _, r := range recs {
		req := Request{At: time.Duration(float64(r.Timestamp-t0) * float64(time.Millisecond) / t.Speedup), MaxTokens: r.OutputLength}
		if t.Text {
			req.Text = TraceText(o.Seed, r)
		} else {
			req.Tokens = TraceTokens(o.Seed, r)
		}
		w.Requests = append(w.Requests, req)
		w.MaxLen = max(w.MaxLen, r.InputLength+r.OutputLength)
		ps := make([]piece, len(r.HashIDs))
		for i, id := range r.HashIDs {
			ps[i] = piece{key: uint64(id), n: TraceBlockSize}
		}
		ps[len(ps)-1].n = r.lastBlockLen()
		w.pieces = append(w.pieces, ps)
	}
	end := w.Requests[len(w.Requests)-1].At
	w.Stages = []Stage{{QPS: float64(len(recs)) / math.Max(float64(end)/float64(time.Second)*o.Fleet.TimeScale, 1e-9), End: end}}
	return w, nil
}

// PoissonLadder returns arrival offsets (wall time) for each stage: a
// Poisson process at qps[i] requests per model second for dur model time,
// compressed by timeScale. The same seed gives the same arrivals.
func PoissonLadder(seed int64, qps []float64, durs []time.Duration, timeScale float64) ([][]time.Duration, []Stage) {
	return ladder(seed, qps, durs, timeScale, false)
}

// CountedLadder is PoissonLadder given each stage's count: round(qps[i] ×
// dur) arrivals at independent uniform times, which is a Poisson process
// conditioned on its count. A stage then offers exactly its rate and
// still bursts as arrivals do; a Poisson count's spread (±32% at 10
// requests) would make a check "at the quote" a check at a random
// multiple of it (TestCountedLadderOffersItsRate).
func CountedLadder(seed int64, qps []float64, durs []time.Duration, timeScale float64) ([][]time.Duration, []Stage) {
	return ladder(seed, qps, durs, timeScale, true)
}

func ladder(seed int64, qps []float64, durs []time.Duration, timeScale float64, counted bool) ([][]time.Duration, []Stage) {
	rng := rand.New(rand.NewPCG(uint64(seed), 0x6c6164646572))
	var out [][]time.Duration
	var stages []Stage
	var start time.Duration // wall time
	for i, q := range qps {
		dur := durs[i]
		wallDur := time.Duration(float64(dur) / timeScale)
		var at []time.Duration
		if counted {
			n := int(math.Round(q * dur.Seconds()))
			at = make([]time.Duration, n)
			for j := range at {
				at[j] = start + time.Duration(rng.Float64()*float64(wallDur))
			}
			slices.Sort(at)
		} else {
			t := 0.0 // model seconds into the stage
			for {
				t += rng.ExpFloat64() / q
				if t >= dur.Seconds() {
					break
				}
				at = append(at, start+time.Duration(t/timeScale*float64(time.Second)))
			}
		}
		out = append(out, at)
		stages = append(stages, Stage{QPS: q, Start: start, End: start + wallDur})
		start += wallDur
	}
	return out, stages
}

// StageLengths are the stages' model-time lengths: StageDurations, or
// StageDuration for each QPS step.
func (sp SharedPrefixOptions) StageLengths() []time.Duration {
	if len(sp.StageDurations) == len(sp.QPS) {
		return sp.StageDurations
	}
	durs := make([]time.Duration, len(sp.QPS))
	for i := range durs {
		durs[i] = sp.StageDuration
	}
	return durs
}

// SharedPrefixWorkload builds the shared-prefix workload: prompts are text, one
// token per word, so prompt lengths are exact for the stand-in tokenizer.
func SharedPrefixWorkload(o Options) *Workload {
	sp := o.Workload.SharedPrefix
	arrive := PoissonLadder
	if sp.Counted {
		arrive = CountedLadder
	}
	arrivals, stages := arrive(o.Seed, sp.QPS, sp.StageLengths(), o.Fleet.TimeScale)
	for i := range min(sp.WarmupStages, len(stages)) {
		stages[i].Warmup = true
	}
	rng := rand.New(rand.NewPCG(uint64(o.Seed), 0x707265666978))
	content := o.Seed
	if sp.ContentSeed != 0 {
		content = sp.ContentSeed
	}
	systems := make([]string, sp.NumGroups)
	for g := range systems {
		systems[g] = words(content, "system", g, 0, sp.SystemPromptLen)
	}
	w := &Workload{Name: fmt.Sprintf("shared prefix: %d groups x %d prompts, %d+%d tokens, %d out",
		sp.NumGroups, sp.PromptsPerGroup, sp.SystemPromptLen, sp.QuestionLen, sp.OutputLen), Stages: stages,
		MaxLen:    sp.SystemPromptLen + sp.QuestionLen + sp.OutputLen,
		BoundNote: "tokens: a request hits its group's system prompt if the group was sent before, and its whole prompt if that exact prompt was"}
	seenGroup := map[int]bool{}
	seenPrompt := map[[2]int]bool{}
	var hits, total int64
	var cycle [][2]int
	if sp.Cycle {
		for g := range sp.NumGroups {
			for p := range sp.PromptsPerGroup {
				cycle = append(cycle, [2]int{g, p})
			}
		}
		rng.Shuffle(len(cycle), func(i, j int) { cycle[i], cycle[j] = cycle[j], cycle[i] })
	}
	group := func() int { return rng.IntN(sp.NumGroups) }
	if sp.GroupSkew > 0 {
		cum := make([]float64, sp.NumGroups)
		total := 0.0
		for g := range cum {
			total += math.Pow(float64(g+1), -sp.GroupSkew)
			cum[g] = total
		}
		group = func() int {
			g, _ := slices.BinarySearch(cum, rng.Float64()*total)
			return min(g, sp.NumGroups-1)
		}
	}
	n := 0
	for s, at := range arrivals {
		for _, t := range at {
			var g, p int
			if sp.Cycle {
				g, p = cycle[n%len(cycle)][0], cycle[n%len(cycle)][1]
			} else {
				g, p = group(), rng.IntN(sp.PromptsPerGroup)
			}
			n++
			w.Requests = append(w.Requests, Request{At: t, Stage: s, MaxTokens: sp.OutputLen,
				Text: systems[g] + words(content, "question", g, p, sp.QuestionLen)})
			w.pieces = append(w.pieces, []piece{{key: uint64(g) << 1, n: sp.SystemPromptLen},
				{key: uint64(g)<<32 | uint64(p)<<1 | 1, n: sp.QuestionLen}})
			n := int64(sp.SystemPromptLen + sp.QuestionLen)
			total += n
			switch {
			case seenPrompt[[2]int{g, p}]:
				hits += n
			case seenGroup[g]:
				hits += int64(sp.SystemPromptLen)
			}
			seenGroup[g], seenPrompt[[2]int{g, p}] = true, true
		}
	}
	if total > 0 {
		w.Bound = float64(hits) / float64(total)
	}
	return w
}

// chatSessions builds the multi-turn chat workload. Its bound depends on the
// answers, so it is estimated from the first run's usage (see chatBound).
func chatSessions(o Options) *Workload {
	c := o.Workload.Chat
	rng := rand.New(rand.NewPCG(uint64(o.Seed), 0x63686174))
	system := "You are a helpful assistant." + words(o.Seed, "chatsys", 0, 0, c.SystemPromptLen)
	w := &Workload{Name: fmt.Sprintf("chat: %d sessions x %d turns, %d-word user turns, %d out", c.Sessions, c.Turns, c.UserLen, c.OutputLen),
		Bound: math.NaN(), BoundNote: "estimated from the first policy's usage: each turn can hit the previous turn's prompt and answer, each session after the first the system prompt",
		MaxLen: c.SystemPromptLen + c.Turns*(c.UserLen+c.OutputLen+64)}
	t := 0.0
	for s := 0; s < c.Sessions; s++ {
		if s > 0 {
			t += rng.ExpFloat64() / c.SessionRate
		}
		sess := &Session{System: system, MaxTokens: c.OutputLen, Tools: c.Tools,
			Think: time.Duration(float64(c.ThinkTime) / o.Fleet.TimeScale)}
		for u := 0; u < c.Turns; u++ {
			sess.Users = append(sess.Users, strings.TrimSpace(words(o.Seed, "user", s, u, c.UserLen)))
		}
		w.Requests = append(w.Requests, Request{At: time.Duration(t / o.Fleet.TimeScale * float64(time.Second)), Session: sess})
	}
	end := w.Requests[len(w.Requests)-1].At
	w.Stages = []Stage{{QPS: c.SessionRate * float64(c.Turns), End: end}}
	return w
}

// agentTools are n function tools whose descriptions total words words:
// the tool schema every agent call sends after the system prompt.
func agentTools(seed int64, n, words_ int) json.RawMessage {
	names := []string{"bash", "str_replace_editor", "find_file", "search_dir", "open_file", "submit"}
	type fn struct {
		Name        string          `json:"name"`
		Description string          `json:"description"`
		Parameters  json.RawMessage `json:"parameters"`
	}
	type tool struct {
		Type     string `json:"type"`
		Function fn     `json:"function"`
	}
	tools := make([]tool, n)
	for i := range tools {
		name := fmt.Sprintf("tool_%d", i)
		if i < len(names) {
			name = names[i]
		}
		per := words_ / n
		if i < words_%n {
			per++
		}
		tools[i] = tool{Type: "function", Function: fn{Name: name, Description: strings.TrimSpace(words(seed, "tooldesc", i, 0, per)),
			Parameters: json.RawMessage(`{"type":"object","properties":{"command":{"type":"string"},"path":{"type":"string"}},"required":["command"]}`)}}
	}
	b, _ := json.Marshal(tools) // plain structs: cannot fail
	return b
}

// logNormal draws a log-normal value of the given median and shape,
// capped at hi and at least lo.
func logNormal(rng *rand.Rand, median, sigma, lo, hi float64) float64 {
	return min(max(median*math.Exp(sigma*rng.NormFloat64()), lo), hi)
}

// agentSessions builds the agent workload. Its bound depends on the tool
// calls the engine makes, so it is estimated from the first run's usage,
// as chat's is.
func agentSessions(o Options) *Workload {
	a := o.Workload.Agents
	rng := rand.New(rand.NewPCG(uint64(o.Seed), 0x6167656e74))
	system := "You are an autonomous software engineering agent." + words(o.Seed, "agentsys", 0, 0, a.SystemLen)
	tools := agentTools(o.Seed, a.Tools, a.SchemaLen)
	ids := "with session ids"
	if a.NoSessionIDs {
		ids = "without session ids"
	}
	w := &Workload{Name: fmt.Sprintf("agents: %d sessions at %g/s, median %d calls, %d+%d shared tokens, results median %d, gaps median %v, %s",
		a.Sessions, a.SessionRate, a.Calls, a.SystemLen, a.SchemaLen, a.ResultLen, a.Gap, ids),
		Bound: math.NaN(), BoundNote: "estimated from the first policy's usage: each call can hit the previous call's prompt and output, each session after the first the shared system prompt and tools"}
	t := 0.0
	budget, ended := max(a.OutputLen, a.ToolCallMax), 0
	for s := 0; s < a.Sessions; s++ {
		if s > 0 {
			t += rng.ExpFloat64() / a.SessionRate
		}
		calls := int(math.Round(logNormal(rng, float64(a.Calls), a.Sigma, 2, float64(a.CallsMax))))
		as := &AgentSession{System: system, Tools: tools, OutputLen: a.OutputLen, ToolCallMax: a.ToolCallMax,
			Task: strings.TrimSpace(words(o.Seed, "agenttask", s, 0, a.TaskLen))}
		if !a.NoSessionIDs {
			as.ID = fmt.Sprintf("agent-%d-%d", o.Seed, s)
		}
		history := a.SystemLen + a.SchemaLen + a.TaskLen
		full := true // every drawn call fits the context window
		for c := 0; c < calls-1; c++ {
			// Draw every call's result and gap even past the window, so a
			// session is the same whatever the window (TestAgentMaxContext).
			n := int(logNormal(rng, float64(a.ResultLen), a.Sigma, 1, float64(a.ResultMax)))
			gap := logNormal(rng, a.Gap.Seconds(), a.Sigma, 0, a.GapMax.Seconds())
			if full && agentCallTokens(history+n+a.ToolCallMax, c+2, a.Tools)+budget > a.MaxContext {
				full = false // call c+1 would not fit: call c answers
				ended++
			}
			if !full {
				continue
			}
			as.Results = append(as.Results, strings.TrimSpace(words(o.Seed, "toolresult", s, c, n)))
			as.Gaps = append(as.Gaps, time.Duration(gap/o.Fleet.TimeScale*float64(time.Second)))
			history += n + a.ToolCallMax
		}
		w.MaxLen = max(w.MaxLen, agentCallTokens(history, as.Calls(), a.Tools)+a.OutputLen)
		w.Requests = append(w.Requests, Request{At: time.Duration(t / o.Fleet.TimeScale * float64(time.Second)), Agent: as})
	}
	end := w.Requests[len(w.Requests)-1].At
	w.Stages = []Stage{{QPS: a.SessionRate * float64(a.Calls), End: end}}
	w.ContextEnded = ended
	if n := *a.Concurrency; n > 0 {
		w.Closed = &ClosedLoop{Agents: n, Ramp: time.Duration(float64(time.Second) / a.SessionRate / o.Fleet.TimeScale),
			Retries: *a.Retries, Backoff: time.Duration(float64(a.RetryBackoff) / o.Fleet.TimeScale)}
		w.Name = fmt.Sprintf("agents: %d sessions by %d agents closed-loop (one more each %gs), median %d calls, %d+%d shared tokens, results median %d, gaps median %v, %s",
			a.Sessions, n, 1/a.SessionRate, a.Calls, a.SystemLen, a.SchemaLen, a.ResultLen, a.Gap, ids)
	}
	w.Name += fmt.Sprintf(", %d ended at the %d-token context", ended, a.MaxContext)
	return w
}

// agentCallOverhead is what a call's prompt adds beyond its words, per
// call of the session so far: the chat template's role markers and a
// tool call's JSON around its arguments; agentToolOverhead is what each
// tool's JSON schema adds beyond its description. TestAgentMaxContext-
// FitsEngine keeps them an upper bound against the simulator's tokenizer.
const (
	agentCallOverhead = 64
	agentToolOverhead = 128
)

// agentCallTokens bounds the prompt of a session's call-th call (1 the
// first) whose messages total history words, with tools tools.
func agentCallTokens(history, call, tools int) int {
	return history + agentToolOverhead*tools + agentCallOverhead*call
}

// BuildWorkload builds the workload of defaulted options.
func BuildWorkload(o Options) (*Workload, error) {
	switch o.Workload.Kind {
	case WorkloadTrace:
		return loadTrace(o)
	case WorkloadSharedPrefix:
		return SharedPrefixWorkload(o), nil
	case WorkloadChat:
		return chatSessions(o), nil
	case WorkloadAgents:
		return agentSessions(o), nil
	}
	return nil, fmt.Errorf("unknown workload %q", o.Workload.Kind)
}

// PeakSessionTokens is the largest sum, over the sessions active at one
// moment, of their histories in tokens (words: one stand-in token each,
// JSON and template tokens left out), had every call taken call (wall
// time) and tool calls toolCall tokens: what an agent workload asks the
// fleet's KV cache to hold at its busiest. 0 for other workloads.
func (w *Workload) PeakSessionTokens(call time.Duration, toolCall int) int64 {
	type span struct {
		at      time.Duration
		history int64
	}
	var spans [][]span // per session: history from each call's start
	var times []time.Duration
	starts := w.sessionStarts(call)
	for i, r := range w.Requests {
		a := r.Agent
		if a == nil {
			continue
		}
		h := int64(len(strings.Fields(a.System)) + len(strings.Fields(a.Task)) + toolWords(a.Tools))
		at := starts[i]
		var ss []span
		for k := range a.Calls() {
			ss = append(ss, span{at, h})
			times = append(times, at)
			if k < len(a.Results) {
				at += call + a.Gaps[k]
				h += int64(len(strings.Fields(a.Results[k])) + toolCall)
			}
		}
		ss = append(ss, span{at + call, -1}) // ended
		spans = append(spans, ss)
	}
	var peak int64
	for _, t := range times {
		var sum int64
		for _, ss := range spans {
			if t < ss[0].at || t >= ss[len(ss)-1].at {
				continue
			}
			i := sort.Search(len(ss), func(i int) bool { return ss[i].at > t }) - 1
			sum += ss[i].history
		}
		peak = max(peak, sum)
	}
	return peak
}

// sessionStarts is when each agent session starts had every call taken
// call: its arrival open-loop; closed-loop, when an agent is free (agent
// k's first session at k ramps, each next one at the end of its previous
// one, to the agent free first, as Replay hands them out).
func (w *Workload) sessionStarts(call time.Duration) []time.Duration {
	starts := make([]time.Duration, len(w.Requests))
	if w.Closed == nil {
		for i, r := range w.Requests {
			starts[i] = r.At
		}
		return starts
	}
	free := make([]time.Duration, w.Closed.Agents)
	for k := range free {
		free[k] = time.Duration(k) * w.Closed.Ramp
	}
	for i, r := range w.Requests {
		k := 0
		for j := range free {
			if free[j] < free[k] {
				k = j
			}
		}
		starts[i] = free[k]
		if a := r.Agent; a != nil {
			free[k] += time.Duration(a.Calls()) * call
			for _, g := range a.Gaps {
				free[k] += g
			}
		}
	}
	return starts
}

// toolWords counts the words of the tools' descriptions.
func toolWords(tools json.RawMessage) int {
	var ts []struct {
		Function struct{ Description string } `json:"function"`
	}
	if json.Unmarshal(tools, &ts) != nil {
		return 0
	}
	n := 0
	for _, t := range ts {
		n += len(strings.Fields(t.Function.Description))
	}
	return n
}
