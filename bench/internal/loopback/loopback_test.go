package loopback

import (
	"context"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestGet(t *testing.T) {
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/json":
			_, _ = w.Write([]byte(`{"n": 3}`))
		case "/text":
			_, _ = w.Write([]byte("not json"))
		default:
			http.NotFound(w, r)
		}
	}))
	defer srv.Close()
	client := Client(5 * time.Second)
	defer client.CloseIdleConnections()
	tests := []struct {
		path    string
		wantN   int
		wantErr string
	}{
		{"/json", 3, ""},
		{"/text", 0, "invalid character"},
		{"/missing", 0, "404 Not Found"},
	}
	for _, tc := range tests {
		t.Run(tc.path, func(t *testing.T) {
			var v struct{ N int }
			err := GetJSON(context.Background(), client, srv.URL+tc.path, &v)
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.wantN, v.N)
			body, err := Get(context.Background(), client, srv.URL+tc.path)
			require.NoError(t, err)
			require.JSONEq(t, `{"n": 3}`, string(body))
		})
	}
	_, err := Get(context.Background(), client, srv.URL+"/missing")
	require.ErrorContains(t, err, "404")
}

func TestFreePorts(t *testing.T) {
	ports, err := FreePorts(3)
	require.NoError(t, err)
	require.Len(t, ports, 3)
	seen := map[int]bool{}
	for _, p := range ports {
		require.False(t, seen[p], "ports are distinct")
		seen[p] = true
		l, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(p))
		require.NoError(t, err, "a reserved port is free again")
		require.NoError(t, l.Close())
	}
	require.Nil(t, Transport().Proxy, "never an environment proxy")
}
