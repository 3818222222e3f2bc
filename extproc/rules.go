package extproc

import (
	"go.uber.org/zap"

	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"

	"github.com/omnious/provider-node/internal/label"
	"github.com/omnious/provider-node/rules"
	"github.com/omnious/provider-node/scheduler"
)

// Prober says, without waiting, whether a request for a model could be
// served now; the scheduler implements it (Scheduler.Headroom).
type Prober interface {
	Headroom(model, band string, subset []string) scheduler.Headroom
}

// Reasons a routed request's response carries in HeaderReason when it was
// sent to one of its model's fallbacks.
const (
	ReasonFallbackNoEndpoint = "fallback_no_endpoint"
	ReasonFallbackSaturated  = "fallback_saturated"
)

// maxRewriteLabels bounds the rewrite names on metric labels; they come
// from the operator's objects, so the bound is only a backstop.
const maxRewriteLabels = 64

// SetRules makes the server apply the model rules in rs to every request
// (rules/README.md): the objective a request names picks its band, a
// rewrite rule or an alias its model, and p decides whether that model's
// fallbacks are needed (nil p: they never are). Call it before the server
// receives streams; a nil rs turns rules off.
func (s *Server) SetRules(rs *rules.Store, p Prober) {
	s.rules, s.prober = rs, p
	if s.rewriteNames == nil {
		s.rewriteNames = label.NewSet(maxRewriteLabels, unknownLabel)
	}
}

// applyRules resolves the request's band and target model from the rules
// in force: the band header's objective maps to a band; a rewrite rule
// matching the body's model replaces the model (winning over the rewrite
// header, as in the Inference Extension), an alias names its model, and
// when that model has no healthy endpoint or its band is past its ceiling
// its first fallback with headroom takes the request. Without rules it
// costs one atomic load; in no case does it allocate (TestAllocsApplyRules).
func (st *stream) applyRules() {
	s := st.s
	t := s.rules.Load()
	if t == nil {
		return
	}
	if st.band != "" {
		if b, ok := t.Band(st.band); ok {
			st.band = b
		}
	}
	if st.clientModel == "" {
		return
	}
	if target, rw, ok := t.Rewrite(st.clientModel); ok {
		st.targetModel = target
		s.m.rewrites.WithLabelValues(s.rewriteNames.Label(rw), s.aliases.Label(st.clientModel), s.models.Label(target)).Inc()
	}
	st.targetModel = t.Canonical(st.targetModel)
	fallbacks := t.Fallbacks(st.targetModel)
	if len(fallbacks) == 0 || s.prober == nil {
		return
	}
	h := s.prober.Headroom(st.targetModel, st.band, st.subset)
	if h == scheduler.HeadroomOK {
		return
	}
	for _, f := range fallbacks {
		if s.prober.Headroom(f, st.band, st.subset) != scheduler.HeadroomOK {
			continue
		}
		st.fallback = ReasonFallbackNoEndpoint
		if h == scheduler.HeadroomSaturated {
			st.fallback = ReasonFallbackSaturated
		}
		s.m.fallbacks.WithLabelValues(s.models.Label(st.targetModel), s.models.Label(f), h.String()).Inc()
		if ce := s.log.Check(zap.DebugLevel, "model fallback"); ce != nil {
			ce.Write(zap.String("id", st.id), zap.String("model", st.targetModel), zap.String("fallback", f), zap.Stringer("cause", h))
		}
		st.targetModel = f
		return
	}
}

// replyModel is the model name the client sees in the response: its own
// name when a rewrite or an alias changed it (mapped back, as the Inference
// Extension does), and the model that answered after a fallback, which
// the reason header announces.
func (st *stream) replyModel() string {
	if st.targetModel == st.clientModel || st.fallback != "" {
		return ""
	}
	return st.clientModel
}

// fallbackHeader adds the fallback reason to the client's response headers.
func (st *stream) fallbackHeader(c *extprocv3.CommonResponse) {
	if st.fallback == "" {
		return
	}
	if c.HeaderMutation == nil {
		c.HeaderMutation = &extprocv3.HeaderMutation{}
	}
	c.HeaderMutation.SetHeaders = append(c.HeaderMutation.SetHeaders, setHeader(HeaderReason, st.fallback))
}
