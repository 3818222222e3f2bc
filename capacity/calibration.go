package capacity

import (
	"cmp"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math"
	"os"
	"slices"
	"time"
)

// CalibrationVersion is the calibration document's format version.
const CalibrationVersion = 2

// Calibration is what `quoter calibrate` measured through a serving URL:
// the client's view of each concurrency level it drove, and the engines'
// curve over the same traffic pooled into one replica's share. An idle
// pool is quoted from Curve until its replicas have measured their own.
type Calibration struct {
	Version int `json:"version"`
	// Model and URL are what was calibrated.
	Model string `json:"model"`
	URL   string `json:"url"`
	// Taken is when the run ended.
	Taken time.Time `json:"taken"`
	// Replicas is how many healthy replicas served the run.
	Replicas int `json:"replicas"`
	// Objectives are those the run stopped at.
	Objectives ObjectivesJSON `json:"objectives"`
	// Mix is the traffic driven, and PromptTokensMeasured what the engine
	// counted of the last preflight prompt, the words having been fitted
	// to Mix.PromptTokens of its tokens (0: its usage had no count).
	Mix                  Mix `json:"mix"`
	PromptTokensMeasured int `json:"prompt_tokens_measured,omitempty"`
	// Levels are the concurrency ladder as the client measured it.
	Levels []Level `json:"levels"`
	// Curve is the engines' curve over the run, one replica's share.
	Curve Curve `json:"curve"`
}

// ObjectivesJSON is Objectives with durations in seconds.
type ObjectivesJSON struct {
	TTFTSeconds float64 `json:"ttft_seconds"`
	ITLSeconds  float64 `json:"itl_seconds"`
	Quantile    float64 `json:"quantile"`
}

// Mix is a calibration's traffic: prompts of PromptTokens of which the
// first SharedPrefixTokens are common to one of Groups groups, answers of
// OutputTokens.
type Mix struct {
	PromptTokens       int `json:"prompt_tokens"`
	SharedPrefixTokens int `json:"shared_prefix_tokens"`
	Groups             int `json:"groups"`
	OutputTokens       int `json:"output_tokens"`
}

// Level is one step of the ladder, measured by the client.
type Level struct {
	Concurrency        int     `json:"concurrency"`
	Requests           int     `json:"requests"`
	Errors             int     `json:"errors"`
	TTFTP95Seconds     float64 `json:"ttft_p95_seconds"`
	ITLP95Seconds      float64 `json:"itl_p95_seconds"`
	OutputTokensPerSec float64 `json:"output_tokens_per_sec"`
	// Within is whether both objectives held.
	Within bool `json:"within"`
}

// Pool adds curves of replicas of one kind into one replica's share:
// bins of the same load are summed, so their latency observations
// add up and their means are weighted by window time. Curves with other
// histogram buckets than the first non-empty one are left out and counted
// in skipped.
func Pool(curves []Curve) (out Curve, skipped int) {
	bins, stall, held := map[int]*Bin{}, map[int]*StallBin{}, map[int]*SustainedBin{}
	for _, c := range curves {
		if len(c.Bins) == 0 {
			continue
		}
		if out.TTFTBounds == nil && out.ITLBounds == nil {
			out.TTFTBounds = append([]float64{}, c.TTFTBounds...)
			out.ITLBounds = append([]float64{}, c.ITLBounds...)
		} else if !equalBounds(out.TTFTBounds, c.TTFTBounds) || !equalBounds(out.ITLBounds, c.ITLBounds) {
			skipped++
			continue
		}
		out.Prefill.add(&c.Prefill)
		sumBins(bins, c.Bins, func(b *Bin) int { return binIndex(b.Concurrency) }, addBin, cloneBin)
		sumBins(stall, c.Stall, func(b *StallBin) int { return stallIndex(b.NewTokensPerSec) }, addStall, cloneStall)
		sumBins(held, c.Sustained, func(b *SustainedBin) int { return binIndex(b.Concurrency) }, addSustained, cloneSustained)
	}
	out.Bins = sortedBins(bins)
	out.Stall = sortedBins(stall)
	out.Sustained = sortedBins(held)
	return out, skipped
}

// sumBins adds bins into m by index.
func sumBins[B any](m map[int]*B, bins []B, index func(*B) int, add func(b, o *B), clone func(B) B) {
	for _, b := range bins {
		k := index(&b)
		if p := m[k]; p != nil {
			add(p, &b)
			continue
		}
		nb := clone(b)
		m[k] = &nb
	}
}

// sortedBins is m's bins ascending by index.
func sortedBins[B any](m map[int]*B) []B {
	keys := slices.Sorted(maps.Keys(m))
	var out []B
	for _, k := range keys {
		out = append(out, *m[k])
	}
	return out
}

// MaxErrorShare is the share of a level's requests that may fail and the
// level still hold: a level whose requests fail measured the failures,
// not the latencies of a fleet that serves.
const MaxErrorShare = 0.05

// HeldStreams is the largest concurrency level of the ladder held within
// o (defaulted) every time it was measured: its p95 time to first token
// and p95 inter-token latency both within, at most MaxErrorShare of its
// requests failed. It is the most streams the whole fleet, every replica
// loaded at once, was seen to hold. ok is false when the levels say
// nothing about o: there are none, or they were measured at another
// quantile.
//
// A level measured twice (the ladder confirms its top, quoter/calibration)
// counts only if both measurements held: the highest of several one-shot
// levels that held is the likeliest to be a lucky draw at the edge, and a
// repeat that breaks refutes it. A level that held above one that broke
// counts (the edge is noisy and the higher level was measured within); a
// level of no requests never held; none held reads 0, true
// (TestHeldStreams).
func (c *Calibration) HeldStreams(o Objectives) (streams float64, ok bool) {
	o = o.WithDefaults()
	if len(c.Levels) == 0 || math.Abs(c.Objectives.Quantile-o.Quantile) > 1e-9 {
		return 0, false
	}
	if held := c.heldLevels(o); len(held) > 0 {
		streams = float64(held[len(held)-1].Concurrency)
	}
	return streams, true
}

// heldLevels is the ladder's levels held within o every time they were
// measured, one per concurrency, ascending, each with the lowest rate
// measured at it: the rate every measurement reached, for the reason a
// repeat must hold to count (TestHeldStreams, TestRateBound).
func (c *Calibration) heldLevels(o Objectives) []Level {
	var levels, broke []Level // by concurrency
	for _, l := range c.Levels {
		into := &levels
		if !l.held(o) {
			into = &broke
		}
		i, found := slices.BinarySearchFunc(*into, l.Concurrency, byConcurrency)
		switch {
		case found:
			(*into)[i].OutputTokensPerSec = min((*into)[i].OutputTokensPerSec, l.OutputTokensPerSec)
		default:
			*into = slices.Insert(*into, i, l)
		}
	}
	return slices.DeleteFunc(levels, func(l Level) bool {
		_, refuted := slices.BinarySearchFunc(broke, l.Concurrency, byConcurrency)
		return refuted
	})
}

func byConcurrency(l Level, c int) int { return cmp.Compare(l.Concurrency, c) }

// held reports whether the level was within o, its requests served.
func (l Level) held(o Objectives) bool {
	return l.Requests > 0 && !l.Failed() &&
		l.TTFTP95Seconds <= o.TTFT.Seconds() && l.ITLP95Seconds <= o.ITL.Seconds()
}

// Failed reports whether more than MaxErrorShare of the level's requests
// failed: it measured the failures, not a fleet that serves, and never
// holds.
func (l Level) Failed() bool {
	return l.Requests > 0 && float64(l.Errors) > MaxErrorShare*float64(l.Requests)
}

// StreamsBound is the most streams a pool of c.Replicas replicas may be
// sold at o, and whether the ladder bounds them at all.
//
// A replica's curve is keyed by its own load alone, so its bins at a load
// may have been learnt while the other replicas ran little: the sum of
// the replicas' streams assumes each keeps its latency whatever the others
// run, which holds for replicas on their own accelerators and not for
// replicas sharing cores. The ladder is the fleet-wide measurement that
// tells them apart, on the calibration's own traffic: its curve read at o
// (Curve.At), summed over its replicas, is what the replicas' curves
// claim the fleet holds. The ladder vouches for that claim when the claim
// is within the levels measured and no level at or below it broke; the
// replicas then added up to what the fleet did, and nothing is bounded
// (ok false), whatever mix the live curves read later. Otherwise the sum
// over-reads the fleet (a load never measured fleet-wide, or one that
// broke), and the bound is HeldStreams. A ladder that says nothing of o
// bounds nothing (TestStreamsBound).
func (c *Calibration) StreamsBound(o Objectives) (streams float64, ok bool) {
	held, ok := c.HeldStreams(o)
	if !ok {
		return 0, false
	}
	if at, err := c.Curve.At(o.WithDefaults()); err == nil && c.vouches(at.Streams*float64(c.Replicas), o.WithDefaults()) {
		return 0, false
	}
	return held, true
}

// RateBound is the most output tokens per second a pool of c.Replicas
// replicas may be sold at o with load requests in flight across it, and
// whether the ladder bounds the rate at all: only where it bounds the
// streams (StreamsBound), for the same reason. The replicas' curves read
// each one's rate at its own share of the load, learnt while the others
// ran what they ran; summed, they claim a rate the fleet may never have
// reached at that load. The ladder measured the fleet's rate at each of
// its levels, every replica loaded at once; read at load over the levels
// that held as HeldStreams counts them (every measurement within; a
// repeated level at the lowest rate measured at it), linear between the
// two around it, in proportion to the lowest below it, the highest held
// level's rate above it, it is the rate the fleet was seen to serve within
// o at that load (TestRateBound).
func (c *Calibration) RateBound(o Objectives, load float64) (tokensPerSec float64, ok bool) {
	if _, bounded := c.StreamsBound(o); !bounded {
		return 0, false
	}
	held := c.heldLevels(o.WithDefaults())
	if len(held) == 0 || load <= 0 {
		return 0, true
	}
	lo := Level{}
	for _, h := range held {
		if x := float64(h.Concurrency); load <= x {
			x0 := float64(lo.Concurrency)
			return lo.OutputTokensPerSec + (h.OutputTokensPerSec-lo.OutputTokensPerSec)*(load-x0)/(x-x0), true
		}
		lo = h
	}
	return lo.OutputTokensPerSec, true
}

// vouches reports whether the ladder measured a load of claim streams or
// more and held every level at or below it.
func (c *Calibration) vouches(claim float64, o Objectives) bool {
	top := 0.0
	for _, l := range c.Levels {
		top = max(top, float64(l.Concurrency))
		if float64(l.Concurrency) <= claim && !l.held(o) {
			return false
		}
	}
	return claim <= top
}

// maxCalibrationBytes bounds a calibration document: a curve is a few
// kilobytes per batch-size bin.
const maxCalibrationBytes = 8 << 20

// ReadCalibration decodes and validates a calibration document.
func ReadCalibration(r io.Reader) (*Calibration, error) {
	var c Calibration
	dec := json.NewDecoder(io.LimitReader(r, maxCalibrationBytes+1))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&c); err != nil {
		return nil, fmt.Errorf("cannot decode calibration: %w", err)
	}
	if err := c.Validate(); err != nil {
		return nil, err
	}
	return &c, nil
}

// LoadCalibration reads a calibration file.
func LoadCalibration(path string) (*Calibration, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("cannot open calibration: %w", err)
	}
	defer f.Close()
	c, err := ReadCalibration(f)
	if err != nil {
		return nil, fmt.Errorf("calibration %s: %w", path, err)
	}
	return c, nil
}

// Validate reports what makes a calibration unusable.
func (c *Calibration) Validate() error {
	if c.Version != CalibrationVersion {
		return fmt.Errorf("calibration version %d is not %d: run quoter calibrate again", c.Version, CalibrationVersion)
	}
	if c.Model == "" {
		return errors.New("calibration names no model")
	}
	if c.Replicas <= 0 {
		return errors.New("calibration has no replica count")
	}
	o := c.Objectives
	for _, v := range []float64{o.TTFTSeconds, o.ITLSeconds, o.Quantile} {
		if !(v > 0) || math.IsInf(v, 0) {
			return errors.New("calibration objectives are not positive numbers")
		}
	}
	for i, l := range c.Levels {
		for _, v := range []float64{float64(l.Concurrency), float64(l.Requests), float64(l.Errors), l.TTFTP95Seconds, l.ITLP95Seconds, l.OutputTokensPerSec} {
			if !(v >= 0) || math.IsInf(v, 0) {
				return fmt.Errorf("calibration level %d has a negative or non-finite value", i)
			}
		}
	}
	if len(c.Curve.Bins) == 0 {
		return errors.New("calibration has an empty curve")
	}
	if err := c.Curve.Validate(); err != nil {
		return fmt.Errorf("calibration curve: %w", err)
	}
	return nil
}

// Write encodes the calibration, indented, if it is one ReadCalibration
// would accept: a file that cannot be loaded is not written.
func (c *Calibration) Write(w io.Writer) error {
	if err := c.Validate(); err != nil {
		return fmt.Errorf("cannot write calibration: %w", err)
	}
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	if err := enc.Encode(c); err != nil {
		return fmt.Errorf("cannot encode calibration: %w", err)
	}
	return nil
}
