package compare

import (
	"fmt"
	"io"
	"strings"
	"sync"
	"time"
)

// progress draws a one-line bar on a terminal: requests done of the whole
// run, the current policy and the elapsed time. A nil writer draws nothing.
type progress struct {
	mu      sync.Mutex
	w       io.Writer
	total   int
	done    int
	label   string
	start   time.Time
	lastOut time.Time
}

func newProgress(w io.Writer, total int) *progress {
	return &progress{w: w, total: max(total, 1), start: time.Now()}
}

func (p *progress) setLabel(l string) {
	p.mu.Lock()
	p.label = l
	p.mu.Unlock()
	p.draw(true)
}

func (p *progress) tick() {
	p.mu.Lock()
	p.done++
	p.mu.Unlock()
	p.draw(false)
}

func (p *progress) draw(force bool) {
	if p.w == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	now := time.Now()
	if !force && now.Sub(p.lastOut) < 200*time.Millisecond {
		return
	}
	p.lastOut = now
	const width = 30
	frac := float64(p.done) / float64(p.total)
	n := min(int(frac*width), width)
	fmt.Fprintf(p.w, "\r[%s%s] %3.0f%% %d/%d %-24.24s %s ", strings.Repeat("#", n), strings.Repeat(".", width-n),
		frac*100, p.done, p.total, p.label, now.Sub(p.start).Truncate(time.Second))
}

func (p *progress) finish() {
	if p.w == nil {
		return
	}
	p.draw(true)
	fmt.Fprintln(p.w)
}
