package discovery

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/omnious/provider-node/endpoint"
	"github.com/omnious/provider-node/internal/opt"
	"github.com/omnious/provider-node/internal/rbac"
	"github.com/omnious/provider-node/rules"
	"go.uber.org/zap"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/client-go/dynamic"
	"k8s.io/client-go/dynamic/dynamicinformer"
	"k8s.io/client-go/informers"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/cache"
)

// poolGVR is the InferencePool resource. The dynamic client reads it as
// unstructured data, so the EPP needs no CRD Go module.
var poolGVR = schema.GroupVersionResource{
	Group:    "inference.networking.k8s.io",
	Version:  "v1",
	Resource: "inferencepools",
}

// PoolConfig configures a Pool source. Label and annotation keys are
// configurable so the EPP can follow an existing deployment's conventions.
type PoolConfig struct {
	// Name and Namespace of the InferencePool (--pool-name,
	// --pool-namespace). Required. Pods are watched in the same namespace.
	Name, Namespace string
	// EngineLabel is the pod label holding the engine type, "vllm" or
	// "sglang". Default "omnious.io/engine".
	EngineLabel string
	// DefaultEngine is used when the label is absent. Default "vllm".
	DefaultEngine string
	// ModelAnnotation and ModelLabel name the pod annotation and label
	// holding the served model; the annotation wins because a label value
	// cannot hold a "/" (as in "org/model"). Both default to
	// "omnious.io/model".
	ModelAnnotation, ModelLabel string
	// DefaultModel is used when neither is set. Default "": a Pod with no
	// model is skipped (and logged).
	DefaultModel string
	// KVEventsAnnotation is the pod annotation holding the KV-event ZMQ
	// PUB port for target port index 0; index i uses port+i (data-parallel
	// ranks on consecutive ports). Absent = no KV events. Default
	// "omnious.io/kv-events-port".
	KVEventsAnnotation string
	// KVReplayAnnotation works the same way for the ZMQ replay port.
	// Default "omnious.io/kv-replay-port".
	KVReplayAnnotation string
	// KVConnectAnnotation, set to "true", says the Pod's engine ranks
	// publish KV events by connecting to the EPP's ingest.bind socket,
	// each with the topic kv@<podIP>:<target port>@<model>; it excludes
	// the two port annotations above. Default "omnious.io/kv-events-connect".
	KVConnectAnnotation string
	// MetricsPortAnnotation overrides the metrics port (index i uses
	// port+i); absent = each target port serves its own metrics. Default
	// "omnious.io/metrics-port".
	MetricsPortAnnotation string
	// MetricsPath is the metrics path on every endpoint. Default "/metrics".
	MetricsPath string
	// Resync is the informers' periodic resync. Default 0 (none): the
	// set only changes on watch events.
	Resync time.Duration
	// Rules, when set, receives the pool's model rules as source
	// "kubernetes": the InferenceObjectives and InferenceModelRewrites of
	// the pool's namespace whose spec.poolRef names the pool. Default
	// none: the CRDs are not read.
	Rules *rules.Store
	// CRDRecheck is how often a rule CRD that is not installed is looked
	// for again. Default 1m.
	CRDRecheck time.Duration
}

// WithDefaults returns c with every unset (empty) field at its default.
func (c PoolConfig) WithDefaults() PoolConfig {
	opt.Zero(&c.EngineLabel, "omnious.io/engine")
	opt.Zero(&c.DefaultEngine, EngineVLLM)
	opt.Zero(&c.ModelAnnotation, "omnious.io/model")
	opt.Zero(&c.ModelLabel, "omnious.io/model")
	opt.Zero(&c.KVEventsAnnotation, "omnious.io/kv-events-port")
	opt.Zero(&c.KVReplayAnnotation, "omnious.io/kv-replay-port")
	opt.Zero(&c.KVConnectAnnotation, "omnious.io/kv-events-connect")
	opt.Zero(&c.MetricsPortAnnotation, "omnious.io/metrics-port")
	opt.Zero(&c.MetricsPath, "/metrics")
	opt.Zero(&c.CRDRecheck, time.Minute)
	return c
}

// fill applies the defaults and validates.
func (c *PoolConfig) fill() error {
	if c.Name == "" || c.Namespace == "" {
		return errors.New("pool name and namespace are required")
	}
	*c = c.WithDefaults()
	if !validEngine(c.DefaultEngine) {
		return fmt.Errorf("default engine %q: want %s or %s", c.DefaultEngine, EngineVLLM, EngineSGLang)
	}
	if !strings.HasPrefix(c.MetricsPath, "/") {
		return fmt.Errorf("metrics path %q must start with /", c.MetricsPath)
	}
	if err := opt.DefaultNonNegative("CRDRecheck", c.CRDRecheck, time.Minute); err != nil {
		return err
	}
	return nil
}

// Pool discovers endpoints from an InferencePool and its ready Pods.
type Pool struct {
	cfg  PoolConfig
	kube kubernetes.Interface
	dyn  dynamic.Interface
	log  *zap.Logger
	// skipAccessCheck lets a test show what the informers do without a
	// grant, which the check at start otherwise refuses first.
	skipAccessCheck bool
}

// poolAccess is what a Pool's informers do, in the pool's namespace only:
// list and watch Pods and InferencePools. The chart's Role grants exactly
// this; Run checks it first.
var poolAccess = []rbac.Need{
	{Verb: "list", Resource: "pods"},
	{Verb: "watch", Resource: "pods"},
	{Verb: "list", Group: poolGVR.Group, Resource: poolGVR.Resource},
	{Verb: "watch", Group: poolGVR.Group, Resource: poolGVR.Resource},
}

// ruleAccess is what the model-rule informers do (PoolConfig.Rules), on
// the group the chart grants: the objective and rewrite CRDs as llm-d-router
// serves them. A cluster with only the older group needs the same verbs
// there.
var ruleAccess = []rbac.Need{
	{Verb: "list", Group: objectiveGVRs[0].Group, Resource: objectiveGVRs[0].Resource},
	{Verb: "watch", Group: objectiveGVRs[0].Group, Resource: objectiveGVRs[0].Resource},
	{Verb: "list", Group: rewriteGVRs[0].Group, Resource: rewriteGVRs[0].Resource},
	{Verb: "watch", Group: rewriteGVRs[0].Group, Resource: rewriteGVRs[0].Resource},
}

var _ Source = (*Pool)(nil)

// NewPool returns a Pool source over the given clients (real or fake); log
// may be nil.
func NewPool(cfg PoolConfig, kube kubernetes.Interface, dyn dynamic.Interface, log *zap.Logger) (*Pool, error) {
	if err := cfg.fill(); err != nil {
		return nil, err
	}
	if log == nil {
		log = zap.NewNop()
	}
	return &Pool{cfg: cfg, kube: kube, dyn: dyn, log: log.With(zap.String("pool", cfg.Namespace+"/"+cfg.Name))}, nil
}

// NewPoolForConfig builds the clients from a REST config (in-cluster or
// kubeconfig, chosen by the caller).
func NewPoolForConfig(cfg PoolConfig, rc *rest.Config, log *zap.Logger) (*Pool, error) {
	kube, err := kubernetes.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("cannot create kubernetes client: %w", err)
	}
	dyn, err := dynamic.NewForConfig(rc)
	if err != nil {
		return nil, fmt.Errorf("cannot create dynamic client: %w", err)
	}
	return NewPool(cfg, kube, dyn, log)
}

// Run watches the pool and its Pods (and, with PoolConfig.Rules, the
// model rule CRDs) until ctx is done. It first asks the API server whether
// it may list and watch Pods and InferencePools (and the rule resources)
// in the namespace, and returns a *rbac.DeniedError naming each missing
// verb and resource if not. The first update comes once the pool informer
// has synced and, if the pool exists, the Pod informer too; a missing pool
// is an empty set. A pool that is never listable (CRD absent) gives no
// update; the informer's errors are logged.
//
// Informer callbacks only mark the state dirty; one loop rebuilds the whole
// set from the caches, so update is never called concurrently and bursts of
// events coalesce.
func (p *Pool) Run(ctx context.Context, update func([]endpoint.Endpoint)) error {
	if !p.skipAccessCheck {
		needs := poolAccess
		if p.cfg.Rules != nil {
			needs = append(slices.Clip(needs), ruleAccess...)
		}
		if err := rbac.Require(ctx, p.kube.AuthorizationV1(), p.log, p.cfg.Namespace, needs...); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return fmt.Errorf("inferencepool %s/%s: %w", p.cfg.Namespace, p.cfg.Name, err)
		}
	}
	r := &poolRun{p: p, update: update, dirty: make(chan struct{}, 1), warned: map[string]string{}}
	poolInf := dynamicinformer.NewFilteredDynamicInformer(p.dyn, poolGVR, p.cfg.Namespace, p.cfg.Resync, cache.Indexers{},
		func(o *metav1.ListOptions) {
			o.FieldSelector = fields.OneTermEqualSelector("metadata.name", p.cfg.Name).String()
		}).Informer()
	if _, err := poolInf.AddEventHandler(r.handler()); err != nil {
		return fmt.Errorf("cannot watch inferencepools: %w", err)
	}
	_ = poolInf.SetWatchErrorHandler(r.watchError("inferencepools"))
	r.poolStore, r.poolSynced = poolInf.GetStore(), poolInf.HasSynced

	stop := make(chan struct{})
	var wg sync.WaitGroup
	defer func() {
		close(stop)
		r.stopPods()
		wg.Wait()
	}()
	wg.Go(func() { poolInf.Run(stop) })
	if p.cfg.Rules != nil {
		rctx, cancel := context.WithCancel(ctx)
		defer cancel() // runs before the deferred wg.Wait above
		wg.Go(func() { newRuleWatch(p).run(rctx) })
	}
	wg.Go(func() {
		if cache.WaitForCacheSync(stop, poolInf.HasSynced) {
			r.signal()
		}
	})
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-r.dirty:
			r.reconcile()
		}
	}
}

// poolRun is the state of one Run. Informer goroutines only send on dirty;
// everything else is touched by the loop goroutine alone.
type poolRun struct {
	p          *Pool
	update     func([]endpoint.Endpoint)
	dirty      chan struct{}
	poolStore  cache.Store
	poolSynced func() bool

	spec    *poolSpec // last valid spec; nil when there is no pool
	specErr string    // last logged spec error
	pods    *podWatch
	emitted bool
	last    []endpoint.Endpoint
	warned  map[string]string // pod name -> last logged problem
}

// podWatch is one Pod informer for one selector; a selector change
// replaces it.
type podWatch struct {
	sel    labels.Selector
	key    string
	store  cache.Store
	synced chan struct{} // closed once the informer has synced
	stop   chan struct{}
	done   sync.WaitGroup
	f      informers.SharedInformerFactory
}

func (r *poolRun) signal() {
	select {
	case r.dirty <- struct{}{}:
	default:
	}
}

func (r *poolRun) handler() cache.ResourceEventHandler {
	return cache.ResourceEventHandlerFuncs{
		AddFunc:    func(any) { r.signal() },
		UpdateFunc: func(any, any) { r.signal() },
		DeleteFunc: func(any) { r.signal() },
	}
}

func (r *poolRun) watchError(what string) cache.WatchErrorHandler {
	log := r.p.log
	return func(_ *cache.Reflector, err error) {
		if apierrors.IsForbidden(err) {
			// Granted at start, revoked since: the set is frozen until the
			// grant returns. The API server's message names verb and resource.
			log.Error("kubernetes access denied, endpoint set frozen until granted", zap.String("resource", what), zap.Error(err))
			return
		}
		log.Warn("kubernetes watch failed, retrying", zap.String("resource", what), zap.Error(err))
	}
}

func (r *poolRun) reconcile() {
	if !r.poolSynced() {
		return
	}
	cfg := &r.p.cfg
	obj, exists, err := r.poolStore.GetByKey(cfg.Namespace + "/" + cfg.Name)
	u, _ := obj.(*unstructured.Unstructured)
	if err != nil || !exists || u == nil {
		if r.spec != nil {
			r.p.log.Warn("inferencepool gone, no endpoints")
		}
		r.spec, r.specErr = nil, ""
		r.stopPods()
		r.emit([]endpoint.Endpoint{})
		return
	}
	spec, err := parsePoolSpec(u)
	if err != nil {
		// The API server validates the CRD, so this is rare; keep serving
		// the last valid spec rather than dropping every endpoint.
		if msg := err.Error(); msg != r.specErr {
			r.specErr = msg
			r.p.log.Error("inferencepool spec invalid, keeping the last valid one", zap.Error(err))
		}
		if r.spec == nil {
			r.emit([]endpoint.Endpoint{})
			return
		}
	} else {
		r.spec, r.specErr = spec, ""
	}
	if key := r.spec.selector.String(); r.pods == nil || r.pods.key != key {
		// Until the new watch has synced, the previous set stays: a
		// selector edit must not flap the pool to empty.
		r.stopPods()
		r.startPods(r.spec.selector)
	}
	select {
	case <-r.pods.synced:
	default:
		return
	}
	r.emit(r.build())
}

func (r *poolRun) startPods(sel labels.Selector) {
	cfg := &r.p.cfg
	w := &podWatch{sel: sel, key: sel.String(), synced: make(chan struct{}), stop: make(chan struct{})}
	w.f = informers.NewSharedInformerFactoryWithOptions(r.p.kube, cfg.Resync,
		informers.WithNamespace(cfg.Namespace),
		informers.WithTweakListOptions(func(o *metav1.ListOptions) { o.LabelSelector = w.key }))
	inf := w.f.Core().V1().Pods().Informer()
	_ = inf.SetTransform(slimPod)
	_, _ = inf.AddEventHandler(r.handler())
	_ = inf.SetWatchErrorHandler(r.watchError("pods"))
	w.store = inf.GetStore()
	w.f.Start(w.stop)
	w.done.Go(func() {
		if cache.WaitForCacheSync(w.stop, inf.HasSynced) {
			close(w.synced)
			r.signal()
		}
	})
	r.pods = w
	r.p.log.Info("watching pods", zap.String("selector", w.key))
}

func (r *poolRun) stopPods() {
	if r.pods == nil {
		return
	}
	close(r.pods.stop)
	r.pods.f.Shutdown()
	r.pods.done.Wait()
	r.pods = nil
}

func (r *poolRun) emit(eps []endpoint.Endpoint) {
	if r.emitted && equalEndpoints(eps, r.last) {
		return
	}
	r.emitted, r.last = true, eps
	r.p.log.Info("pool endpoints changed", zap.Int("endpoints", len(eps)))
	r.update(eps)
}

// build turns the cached Pods into the endpoint set. Pods are visited by
// name so that a conflict (two hostNetwork Pods on one node) resolves the
// same way every time.
func (r *poolRun) build() []endpoint.Endpoint {
	var pods []*corev1.Pod
	for _, o := range r.pods.store.List() {
		// Defensive: a real watch delivers a Pod relabelled out of the
		// selector as a delete, so the store holds only matching Pods.
		if pod, ok := o.(*corev1.Pod); ok && r.pods.sel.Matches(labels.Set(pod.Labels)) {
			pods = append(pods, pod)
		}
	}
	slices.SortFunc(pods, func(a, b *corev1.Pod) int { return strings.Compare(a.Name, b.Name) })
	eps := make([]endpoint.Endpoint, 0, len(pods)*len(r.spec.ports))
	seen := make(map[string]string, cap(eps))
	warned := make(map[string]string, len(r.warned))
	warn := func(pod, problem string) {
		warned[pod] = problem
		if r.warned[pod] != problem {
			r.p.log.Warn("pod endpoint problem", zap.String("pod", pod), zap.String("problem", problem))
		}
	}
	for _, pod := range pods {
		got, problem := podEndpoints(pod, r.spec.ports, &r.p.cfg)
		for _, ep := range got {
			if other, dup := seen[ep.Addr]; dup {
				problem = joinProblem(problem, fmt.Sprintf("address %s already served by pod %s, skipped", ep.Addr, other))
				continue
			}
			seen[ep.Addr] = pod.Name
			eps = append(eps, ep)
		}
		if problem != "" {
			warn(pod.Name, problem)
		}
	}
	r.warned = warned
	sortEndpoints(eps)
	return eps
}

func joinProblem(a, b string) string {
	if a == "" {
		return b
	}
	return a + "; " + b
}

// poolSpec is the part of an InferencePool the EPP uses.
type poolSpec struct {
	selector labels.Selector
	ports    []int
}

func parsePoolSpec(u *unstructured.Unstructured) (*poolSpec, error) {
	ml, found, err := unstructured.NestedStringMap(u.Object, "spec", "selector", "matchLabels")
	if err != nil {
		return nil, fmt.Errorf("spec.selector.matchLabels: %w", err)
	}
	// An empty selector would match every Pod in the namespace.
	if !found || len(ml) == 0 {
		return nil, errors.New("spec.selector.matchLabels is empty")
	}
	sel, err := labels.ValidatedSelectorFromSet(ml)
	if err != nil {
		return nil, fmt.Errorf("spec.selector.matchLabels: %w", err)
	}
	raw, found, err := unstructured.NestedSlice(u.Object, "spec", "targetPorts")
	if err != nil {
		return nil, fmt.Errorf("spec.targetPorts: %w", err)
	}
	if !found || len(raw) == 0 {
		return nil, errors.New("spec.targetPorts is empty")
	}
	spec := &poolSpec{selector: sel, ports: make([]int, 0, len(raw))}
	for i, item := range raw {
		m, _ := item.(map[string]any)
		n, ok := asInt(m["number"])
		if !ok || n < 1 || n > 65535 {
			return nil, fmt.Errorf("spec.targetPorts[%d].number %v: want a port 1-65535", i, m["number"])
		}
		if slices.Contains(spec.ports, n) {
			return nil, fmt.Errorf("spec.targetPorts[%d].number %d repeated", i, n)
		}
		spec.ports = append(spec.ports, n)
	}
	return spec, nil
}

// asInt accepts the number types unstructured JSON decoding produces.
func asInt(v any) (int, bool) {
	switch n := v.(type) {
	case int64:
		return int(n), true
	case int:
		return n, true
	case int32:
		return int(n), true
	case float64:
		if n == float64(int(n)) {
			return int(n), true
		}
	}
	return 0, false
}

// podReady reports whether a Pod may receive traffic: Ready, not being
// deleted, and addressed.
func podReady(pod *corev1.Pod) bool {
	if pod.DeletionTimestamp != nil || pod.Status.PodIP == "" {
		return false
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			return c.Status == corev1.ConditionTrue
		}
	}
	return false
}

// podEndpoints returns one endpoint per target port of a ready Pod, and a
// description of anything wrong with the Pod's labels or annotations ("" if
// nothing). A bad engine or a missing model drop the Pod; a bad port
// annotation only drops that feature (KV events, replay, own metrics port),
// since routing without it is still better than not routing.
func podEndpoints(pod *corev1.Pod, ports []int, cfg *PoolConfig) ([]endpoint.Endpoint, string) {
	if !podReady(pod) {
		return nil, ""
	}
	engine := cfg.DefaultEngine
	if v, ok := pod.Labels[cfg.EngineLabel]; ok {
		engine = v
	}
	if !validEngine(engine) {
		return nil, fmt.Sprintf("label %s=%q: want %s or %s; pod skipped", cfg.EngineLabel, engine, EngineVLLM, EngineSGLang)
	}
	model := pick(pod.Annotations[cfg.ModelAnnotation], pod.Labels[cfg.ModelLabel], cfg.DefaultModel)
	if model == "" {
		return nil, fmt.Sprintf("no model: set annotation or label %s, or a default model; pod skipped", cfg.ModelLabel)
	}
	var problem string
	base := func(key string) int {
		v, ok := pod.Annotations[key]
		if !ok {
			return 0
		}
		n, err := strconv.Atoi(strings.TrimSpace(v))
		if err != nil || n < 1 || n+len(ports)-1 > 65535 {
			problem = joinProblem(problem, fmt.Sprintf("annotation %s=%q: want a port such that port+%d <= 65535; ignored", key, v, len(ports)-1))
			return 0
		}
		return n
	}
	kv, replay, metrics := base(cfg.KVEventsAnnotation), base(cfg.KVReplayAnnotation), base(cfg.MetricsPortAnnotation)
	var connect bool
	if v, ok := pod.Annotations[cfg.KVConnectAnnotation]; ok {
		switch c, err := strconv.ParseBool(strings.TrimSpace(v)); {
		case err != nil:
			problem = joinProblem(problem, fmt.Sprintf("annotation %s=%q: want true or false; ignored", cfg.KVConnectAnnotation, v))
		case c && (kv != 0 || replay != 0):
			problem = joinProblem(problem, fmt.Sprintf("annotation %s=true excludes %s and %s; KV events ignored",
				cfg.KVConnectAnnotation, cfg.KVEventsAnnotation, cfg.KVReplayAnnotation))
			kv, replay = 0, 0
		default:
			connect = c
		}
	}
	ip := pod.Status.PodIP
	eps := make([]endpoint.Endpoint, 0, len(ports))
	for i, port := range ports {
		ep := endpoint.Endpoint{
			Addr:      net.JoinHostPort(ip, strconv.Itoa(port)),
			Model:     model,
			Engine:    engine,
			KVConnect: connect,
		}
		if len(pod.Labels) > 0 {
			// Each endpoint gets its own map: the informer cache owns the
			// Pod's, and consumers must not see a sibling's edits.
			ep.Labels = maps.Clone(pod.Labels)
		}
		mport := port
		if metrics != 0 {
			mport = metrics + i
		}
		ep.MetricsURL = "http://" + net.JoinHostPort(ip, strconv.Itoa(mport)) + cfg.MetricsPath
		if kv != 0 {
			ep.KVEvents = "tcp://" + net.JoinHostPort(ip, strconv.Itoa(kv+i))
		}
		if replay != 0 {
			ep.KVReplay = "tcp://" + net.JoinHostPort(ip, strconv.Itoa(replay+i))
		}
		eps = append(eps, ep)
	}
	return eps, problem
}

// slimPod keeps only what podEndpoints reads, so a large pool's informer
// cache does not hold every Pod's full spec and managed fields.
func slimPod(obj any) (any, error) {
	pod, ok := obj.(*corev1.Pod)
	if !ok {
		return obj, nil
	}
	slim := &corev1.Pod{
		TypeMeta: pod.TypeMeta,
		ObjectMeta: metav1.ObjectMeta{
			Name:              pod.Name,
			Namespace:         pod.Namespace,
			UID:               pod.UID,
			ResourceVersion:   pod.ResourceVersion,
			Labels:            pod.Labels,
			Annotations:       pod.Annotations,
			DeletionTimestamp: pod.DeletionTimestamp,
		},
		Status: corev1.PodStatus{PodIP: pod.Status.PodIP},
	}
	for _, c := range pod.Status.Conditions {
		if c.Type == corev1.PodReady {
			slim.Status.Conditions = []corev1.PodCondition{{Type: c.Type, Status: c.Status}}
		}
	}
	return slim, nil
}
