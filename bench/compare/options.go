package compare

import (
	"errors"
	"fmt"
	"io"

	"github.com/omnious/provider-node/bench/rig"
)

// maxEPPs bounds Options.EPPs: more EPPs than this on one small machine
// measure the machine, not the routing.
const maxEPPs = 8

// Options is one comparison: the rig's fleet, traffic and client, and the
// policies raced on it. Every default is applied in WithDefaults.
type Options struct {
	rig.Options
	// Policies are run one after another, each on a fresh fleet: policy
	// names, EPP config files, or external EPPs (rig.PolicyExec,
	// rig.PolicyAddr). Default DefaultPolicies().
	Policies []string
	// Labels, when set, name Policies in the results (one per policy); the
	// sweep uses them for generated config files. Default: the policy
	// itself, an external EPP's label.
	Labels []string
	// EPPs is how many EPPs serve the pool side by side, each with the
	// policy's config, behind the one gateway, which spreads streams over
	// them as an Envoy cluster does (the Helm chart deploys 2). An exec:
	// EPP runs as that many processes; an addr: EPP is the one it names.
	// Default 1.
	EPPs int
	// Progress receives a progress bar (carriage-return updates); nil for
	// none.
	Progress io.Writer
	// Published is the published run a preset reproduces, printed beside
	// this one's stages; nil for none.
	Published *Published
}

// WithDefaults fills every unset field.
func (o Options) WithDefaults() Options {
	if len(o.Policies) == 0 {
		o.Policies = DefaultPolicies()
	}
	if o.EPPs == 0 {
		o.EPPs = 1
	}
	o.Options = o.Options.WithDefaults()
	return o
}

// Validate reports every problem with defaulted options.
func (o Options) Validate() error {
	var errs []error
	if len(o.Labels) != 0 && len(o.Labels) != len(o.Policies) {
		errs = append(errs, fmt.Errorf("%d labels for %d policies", len(o.Labels), len(o.Policies)))
	}
	errs = append(errs, o.validatePolicies()...)
	if o.EPPs < 1 || o.EPPs > maxEPPs {
		errs = append(errs, fmt.Errorf("epps %d: want 1..%d", o.EPPs, maxEPPs))
	}
	if err := o.Options.Validate(); err != nil {
		errs = append(errs, err)
	}
	return errors.Join(errs...)
}

// validatePolicies checks the exec: and addr: policies and that every
// result has its own name.
func (o Options) validatePolicies() []error {
	var errs []error
	seen := map[string]bool{}
	for i, p := range o.Policies {
		malformed, misplaced := rig.ValidatePolicy(p, o.Fleet.Mode)
		if malformed != nil {
			errs = append(errs, malformed)
			continue
		}
		if misplaced != nil {
			errs = append(errs, misplaced)
		}
		label := rig.PolicyLabel(p)
		if len(o.Labels) == len(o.Policies) {
			label = o.Labels[i]
		}
		if seen[label] {
			errs = append(errs, fmt.Errorf("two policies are named %q: give each exec:/addr: policy its own label (exec:LABEL=COMMAND)", label))
		}
		seen[label] = true
	}
	return errs
}
