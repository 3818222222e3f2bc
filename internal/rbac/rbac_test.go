package rbac

import (
	"context"
	"net"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.uber.org/zap"
	"go.uber.org/zap/zaptest/observer"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
)

// Granted and denied needs are tested against a real API server by the
// discovery package's Pool tests; here, what the API server does not answer.

func TestDeniedErrorNamesEveryNeed(t *testing.T) {
	err := &DeniedError{Namespace: "serving", Denied: []Need{
		{Verb: "watch", Resource: "pods"},
		{Verb: "list", Group: "inference.networking.k8s.io", Resource: "inferencepools"},
	}}
	require.Equal(t, `RBAC: this identity cannot watch pods, list inferencepools.inference.networking.k8s.io in namespace "serving"; grant it with a Role bound to it`, err.Error())
}

func TestRequireRetriesAnUnreachableServer(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close()) // nothing listens: connection refused
	c, err := kubernetes.NewForConfig(&rest.Config{Host: "http://" + addr})
	require.NoError(t, err)
	core, logs := observer.New(zap.WarnLevel)
	ctx, cancel := context.WithTimeout(context.Background(), 1200*time.Millisecond)
	defer cancel()
	err = Require(ctx, c.AuthorizationV1(), zap.New(core), "serving", Need{Verb: "list", Resource: "pods"})
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.GreaterOrEqual(t, logs.FilterMessage("cannot review access, retrying").Len(), 1)
}
