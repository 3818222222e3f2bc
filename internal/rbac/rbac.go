// Package rbac checks, before a component starts watching the API server,
// that its identity holds every permission it needs, so a missing grant is
// one error naming the verb and resource rather than informers retrying
// forever on a stale or empty view.
package rbac

import (
	"context"
	"fmt"
	"strings"
	"time"

	"go.uber.org/zap"
	authorizationv1 "k8s.io/api/authorization/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	authzclient "k8s.io/client-go/kubernetes/typed/authorization/v1"
)

// Need is one permission: Verb on Resource of API group Group ("" is the
// core group).
type Need struct {
	Verb, Group, Resource string
}

func (n Need) String() string {
	if n.Group == "" {
		return n.Verb + " " + n.Resource
	}
	return n.Verb + " " + n.Resource + "." + n.Group
}

// DeniedError lists the needs the API server refused.
type DeniedError struct {
	Namespace string
	Denied    []Need
}

func (e *DeniedError) Error() string {
	names := make([]string, len(e.Denied))
	for i, n := range e.Denied {
		names[i] = n.String()
	}
	return fmt.Sprintf("RBAC: this identity cannot %s in namespace %q; grant it with a Role bound to it",
		strings.Join(names, ", "), e.Namespace)
}

// Require asks the API server, with one SelfSubjectAccessReview per need
// (which every authenticated identity may create), whether the caller holds
// each need in namespace. It returns a *DeniedError listing every refused
// need. A review that cannot be made (API server unreachable) is logged and
// retried, backing off from 0.5 s to 30 s, until ctx ends; then ctx's error
// is returned.
func Require(ctx context.Context, c authzclient.SelfSubjectAccessReviewsGetter, log *zap.Logger, namespace string, needs ...Need) error {
	var denied []Need
	for _, n := range needs {
		allowed, err := review(ctx, c, log, namespace, n)
		if err != nil {
			return err
		}
		if !allowed {
			denied = append(denied, n)
		}
	}
	if len(denied) > 0 {
		return &DeniedError{Namespace: namespace, Denied: denied}
	}
	return nil
}

func review(ctx context.Context, c authzclient.SelfSubjectAccessReviewsGetter, log *zap.Logger, namespace string, n Need) (bool, error) {
	req := &authorizationv1.SelfSubjectAccessReview{Spec: authorizationv1.SelfSubjectAccessReviewSpec{
		ResourceAttributes: &authorizationv1.ResourceAttributes{Namespace: namespace, Verb: n.Verb, Group: n.Group, Resource: n.Resource},
	}}
	delay := 500 * time.Millisecond
	for {
		resp, err := c.SelfSubjectAccessReviews().Create(ctx, req, metav1.CreateOptions{})
		switch {
		case err == nil:
			return resp.Status.Allowed, nil
		case apierrors.IsUnauthorized(err) || apierrors.IsForbidden(err):
			// Bad credentials, or even self-review refused: nothing to wait for.
			return false, fmt.Errorf("cannot review access to %s: %w", n, err)
		case ctx.Err() != nil:
			return false, ctx.Err()
		}
		log.Warn("cannot review access, retrying", zap.Stringer("need", n), zap.Duration("retry_in", delay), zap.Error(err))
		select {
		case <-ctx.Done():
			return false, ctx.Err()
		case <-time.After(delay):
		}
		delay = min(2*delay, 30*time.Second)
	}
}
