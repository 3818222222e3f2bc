package discovery

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"time"

	"go.uber.org/zap"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/tools/cache"

	"github.com/omnious/provider-node/rules"
)

// The rule CRDs in the groups llm-d-router reads them from, preferred
// first: llm-d.ai, and the Inference Extension's former group when only
// that one is installed.
var (
	objectiveGVRs = []schema.GroupVersionResource{
		{Group: "llm-d.ai", Version: "v1alpha2", Resource: "inferenceobjectives"},
		{Group: "inference.networking.x-k8s.io", Version: "v1alpha2", Resource: "inferenceobjectives"},
	}
	rewriteGVRs = []schema.GroupVersionResource{
		{Group: "llm-d.ai", Version: "v1alpha2", Resource: "inferencemodelrewrites"},
		{Group: "inference.networking.x-k8s.io", Version: "v1alpha2", Resource: "inferencemodelrewrites"},
	}
)

// RulesSource is the Store source name of the rules read from the API.
const RulesSource = "kubernetes"

// poolRef is the spec.poolRef both CRDs carry.
type poolRef struct {
	Group string `json:"group"`
	Name  string `json:"name"`
}

// refers reports whether the reference names the pool: its name, in the
// InferencePool group (the CRDs default an empty group to it), as
// llm-d-router compares them.
func (r *poolRef) refers(pool string) bool {
	g := r.Group
	if g == "" {
		g = poolGVR.Group
	}
	return r.Name == pool && g == poolGVR.Group
}

// decodeSpec reads the object's spec into v through JSON, so a field of
// the wrong type (a string priority, a weight past int32) is an error
// rather than a silent conversion.
func decodeSpec(u *unstructured.Unstructured, v any) error {
	spec, ok := u.Object["spec"]
	if !ok {
		return errors.New("no spec")
	}
	data, err := json.Marshal(spec)
	if err != nil {
		return fmt.Errorf("spec: %w", err)
	}
	if err := json.Unmarshal(data, v); err != nil {
		return fmt.Errorf("spec: %w", err)
	}
	return nil
}

// objectiveOf converts an InferenceObjective. ours is false for an object
// of another pool (not an error); err says why an object of this pool is
// unusable.
func objectiveOf(u *unstructured.Unstructured, pool string) (o rules.Objective, ours bool, err error) {
	var spec struct {
		Priority *int32  `json:"priority"`
		PoolRef  poolRef `json:"poolRef"`
	}
	if err := decodeSpec(u, &spec); err != nil {
		return o, true, err
	}
	if !spec.PoolRef.refers(pool) {
		return o, false, nil
	}
	o = rules.Objective{Name: u.GetName(), Priority: spec.Priority}
	return o, true, o.Validate()
}

// rewriteOf converts an InferenceModelRewrite as objectiveOf does.
func rewriteOf(u *unstructured.Unstructured, pool string) (r rules.Rewrite, ours bool, err error) {
	var spec struct {
		PoolRef *poolRef     `json:"poolRef"`
		Rules   []rules.Rule `json:"rules"`
	}
	if err := decodeSpec(u, &spec); err != nil {
		return r, true, err
	}
	if spec.PoolRef == nil || !spec.PoolRef.refers(pool) {
		return r, false, nil
	}
	r = rules.Rewrite{Name: u.GetName(), Rules: spec.Rules, Created: u.GetCreationTimestamp().Time}
	return r, true, r.Validate()
}

// ruleKind is one of the two CRDs as the watch handles it.
type ruleKind struct {
	name string // for logs
	gvrs []schema.GroupVersionResource
}

var (
	objectiveKind = ruleKind{"inferenceobjectives", objectiveGVRs}
	rewriteKind   = ruleKind{"inferencemodelrewrites", rewriteGVRs}
)

// lastGood is what the watch remembers of one object.
type lastGood[T any] struct {
	value  T
	ok     bool   // value holds a version that converted
	logged string // the last problem logged, "" when none
}

// ruleWatch reads InferenceObjectives and InferenceModelRewrites of the
// pool's namespace that refer to the pool and hands them to the store. An
// object whose new version is invalid keeps its last good version and is
// logged once per distinct problem.
type ruleWatch struct {
	p     *Pool
	dirty chan struct{}

	waits     sync.WaitGroup // the goroutines waiting for an informer's sync
	mu        sync.Mutex     // guards the informer lists below, written by start
	synced    []cache.InformerSynced
	objStore  cache.Store // nil until the kind is found
	rwStore   cache.Store
	factories []dynamicinformer.DynamicSharedInformerFactory

	objectives map[string]*lastGood[rules.Objective] // by object name
	rewrites   map[string]*lastGood[rules.Rewrite]
	last       *rules.Spec
	set        bool
	missing    map[string]string // kind -> why it was not found, as last logged
	refused    string            // the store's last logged refusal
}

func newRuleWatch(p *Pool) *ruleWatch {
	return &ruleWatch{p: p, dirty: make(chan struct{}, 1),
		objectives: map[string]*lastGood[rules.Objective]{}, rewrites: map[string]*lastGood[rules.Rewrite]{},
		missing: map[string]string{}}
}

func (w *ruleWatch) signal() {
	select {
	case w.dirty <- struct{}{}:
	default:
	}
}

// run finds the served group of each kind (looking again every
// CRDRecheck for a kind not installed), watches it, and publishes the
// rules whenever they change, until ctx is done.
func (w *ruleWatch) run(ctx context.Context) {
	defer func() {
		w.mu.Lock()
		defer w.mu.Unlock()
		for _, f := range w.factories {
			f.Shutdown()
		}
		w.waits.Wait()
	}()
	missing := []ruleKind{objectiveKind, rewriteKind}
	missing = w.find(ctx, missing)
	tick := time.NewTicker(w.p.cfg.CRDRecheck)
	defer tick.Stop()
	w.signal()
	for {
		select {
		case <-ctx.Done():
			return
		case <-w.dirty:
			w.publish()
		case <-tick.C:
			if len(missing) > 0 {
				missing = w.find(ctx, missing)
			}
		}
	}
}

// find starts an informer for every kind of missing that is now served
// and returns the kinds still missing.
func (w *ruleWatch) find(ctx context.Context, missing []ruleKind) []ruleKind {
	var still []ruleKind
	for _, k := range missing {
		gvr, ok := w.served(ctx, k)
		if !ok {
			still = append(still, k)
			continue
		}
		w.start(ctx, k, gvr)
	}
	return still
}

// served returns the preferred group whose kind the EPP can list in the
// pool's namespace. A group that answers NotFound is not installed; any
// other error (Forbidden: the Role lacks a verb) is logged once per kind
// and problem, and the kind is looked for again at the next recheck.
func (w *ruleWatch) served(ctx context.Context, k ruleKind) (schema.GroupVersionResource, bool) {
	log := w.p.log
	list := func(gvr schema.GroupVersionResource) error {
		_, err := w.p.dyn.Resource(gvr).Namespace(w.p.cfg.Namespace).List(ctx, metav1.ListOptions{Limit: 1})
		return err
	}
	var problems []string
	for i, gvr := range k.gvrs {
		err := list(gvr)
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			problems = append(problems, gvr.String()+": "+err.Error())
			continue
		}
		for _, other := range k.gvrs[i+1:] {
			if list(other) == nil {
				log.Warn("model rules installed in two groups: reading the preferred one, ignoring the other",
					zap.String("reading", gvr.GroupVersion().String()), zap.String("ignoring", other.GroupVersion().String()))
			}
		}
		log.Info("watching model rules", zap.String("resource", gvr.String()))
		return gvr, true
	}
	if ctx.Err() != nil {
		return schema.GroupVersionResource{}, false
	}
	msg := "not installed"
	if len(problems) > 0 {
		msg = strings.Join(problems, "; ")
	}
	if w.missing[k.name] != msg {
		w.missing[k.name] = msg
		if len(problems) > 0 {
			log.Error("cannot list model rules; looking again later", zap.String("kind", k.name), zap.String("problem", msg),
				zap.Duration("recheck", w.p.cfg.CRDRecheck))
		} else {
			log.Info("model rule CRD not installed; looking again later", zap.String("kind", k.name), zap.Duration("recheck", w.p.cfg.CRDRecheck))
		}
	}
	return schema.GroupVersionResource{}, false
}

func (w *ruleWatch) start(ctx context.Context, k ruleKind, gvr schema.GroupVersionResource) {
	f := dynamicinformer.NewFilteredDynamicSharedInformerFactory(w.p.dyn, w.p.cfg.Resync, w.p.cfg.Namespace, nil)
	inf := f.ForResource(gvr).Informer()
	_, _ = inf.AddEventHandler(cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { w.signal() },
		UpdateFunc: func(any, any) { w.signal() },
		DeleteFunc: func(any) { w.signal() },
	})
	_ = inf.SetWatchErrorHandler(func(_ *cache.Reflector, err error) {
		w.p.log.Warn("kubernetes watch failed, retrying", zap.String("resource", gvr.String()), zap.Error(err))
	})
	w.mu.Lock()
	if k.name == objectiveKind.name {
		w.objStore = inf.GetStore()
	} else {
		w.rwStore = inf.GetStore()
	}
	w.synced = append(w.synced, inf.HasSynced)
	w.factories = append(w.factories, f)
	w.mu.Unlock()
	f.Start(ctx.Done())
	w.waits.Go(func() {
		if cache.WaitForCacheSync(ctx.Done(), inf.HasSynced) {
			w.signal()
		}
	})
}

// publish rebuilds the rules from the caches once every started informer
// has synced, and hands them to the store when they changed.
func (w *ruleWatch) publish() {
	w.mu.Lock()
	synced := slices.Clone(w.synced)
	objStore, rwStore := w.objStore, w.rwStore
	w.mu.Unlock()
	for _, s := range synced {
		if !s() {
			return
		}
	}
	pool := w.p.cfg.Name
	spec := &rules.Spec{
		Objectives: collect(w, w.objectives, objStore, "inferenceobjective", func(u *unstructured.Unstructured) (rules.Objective, bool, error) {
			return objectiveOf(u, pool)
		}),
		Rewrites: collect(w, w.rewrites, rwStore, "inferencemodelrewrite", func(u *unstructured.Unstructured) (rules.Rewrite, bool, error) {
			return rewriteOf(u, pool)
		}),
	}
	if w.set && reflect.DeepEqual(spec, w.last) {
		return
	}
	if err := w.p.cfg.Rules.Set(RulesSource, spec); err != nil {
		// Objects are valid one by one and names are unique per kind and
		// namespace; a clash can only be with another source.
		if msg := err.Error(); msg != w.refused {
			w.refused = msg
			w.p.log.Error("model rules from the API refused, keeping the last good ones", zap.Error(err))
		}
		return
	}
	w.last, w.set, w.refused = spec, true, ""
	w.p.log.Info("model rules updated", zap.Int("objectives", len(spec.Objectives)), zap.Int("rewrites", len(spec.Rewrites)))
}

// collect converts the objects of store (nil: kind not installed) that
// refer to the pool, by name, remembering each one's last good version in
// seen: an invalid version is logged once per distinct problem and the
// last good one (none if it never converted) used instead. Objects gone
// from the cache or moved to another pool are forgotten.
func collect[T any](w *ruleWatch, seen map[string]*lastGood[T], store cache.Store, kind string,
	conv func(*unstructured.Unstructured) (T, bool, error)) []T {
	var out []T
	present := map[string]bool{}
	for _, u := range sortedObjects(store) {
		name := u.GetName()
		v, ours, err := conv(u)
		if !ours {
			continue
		}
		present[name] = true
		g := seen[name]
		if g == nil {
			g = &lastGood[T]{}
			seen[name] = g
		}
		if err == nil {
			g.value, g.ok, g.logged = v, true, ""
		} else if msg := err.Error(); msg != g.logged {
			g.logged = msg
			what := "ignored"
			if g.ok {
				what = "ignored, its last good version stays"
			}
			w.p.log.Error("invalid "+kind+" "+what, zap.String("name", w.p.cfg.Namespace+"/"+name),
				zap.String("resourceVersion", u.GetResourceVersion()), zap.Error(err))
		}
		if g.ok {
			out = append(out, g.value)
		}
	}
	for name := range seen {
		if !present[name] {
			delete(seen, name)
		}
	}
	return out
}

// sortedObjects lists a cache's objects by name, so equal timestamps
// resolve the same way every time.
func sortedObjects(store cache.Store) []*unstructured.Unstructured {
	if store == nil {
		return nil
	}
	var out []*unstructured.Unstructured
	for _, o := range store.List() {
		if u, ok := o.(*unstructured.Unstructured); ok {
			out = append(out, u)
		}
	}
	slices.SortFunc(out, func(a, b *unstructured.Unstructured) int { return strings.Compare(a.GetName(), b.GetName()) })
	return out
}
