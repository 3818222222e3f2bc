// Package loopback is how the bench talks to the servers it starts on
// 127.0.0.1: an HTTP transport that never takes a proxy from the
// environment, free ports, and small GET helpers. Of the project it imports
// only freeport.
package loopback

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"time"

	"github.com/omnious/provider-node/internal/testutil/freeport"
)

// maxBody bounds what Get reads: a metrics page of a large replica is a few
// MiB at most.
const maxBody = 16 << 20

// Transport is an HTTP transport for loopback servers. It keeps many idle
// connections, since an open-loop client holds thousands in flight, and
// never uses an environment proxy, which would send loopback traffic away.
func Transport() *http.Transport {
	return &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second}).DialContext,
		MaxIdleConns:        4096,
		MaxIdleConnsPerHost: 4096,
		IdleConnTimeout:     30 * time.Second,
		DisableCompression:  true,
	}
}

// Client is an HTTP client over Transport whose requests end after timeout.
func Client(timeout time.Duration) *http.Client {
	return &http.Client{Transport: Transport(), Timeout: timeout}
}

// FreePorts reserves n loopback ports for children to bind, from below
// the ephemeral range where the bench's own outgoing connections cannot
// take them (see freeport); a small race with other programs is accepted
// (the start then fails loudly).
func FreePorts(n int) ([]int, error) {
	return freeport.Take(n)
}

// Get GETs url with client and returns its body (at most 16 MiB); a status
// other than 200 is an error.
func Get(ctx context.Context, client *http.Client, url string) ([]byte, error) {
	resp, err := get(ctx, client, url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, maxBody))
	if err != nil {
		return nil, fmt.Errorf("GET %s: %w", url, err)
	}
	return body, nil
}

// GetJSON GETs url with client and decodes its JSON body into v.
func GetJSON(ctx context.Context, client *http.Client, url string, v any) error {
	resp, err := get(ctx, client, url)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if err := json.NewDecoder(resp.Body).Decode(v); err != nil {
		return fmt.Errorf("GET %s: %w", url, err)
	}
	return nil
}

func get(ctx context.Context, client *http.Client, url string) (*http.Response, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		resp.Body.Close()
		return nil, fmt.Errorf("GET %s: %s", url, resp.Status)
	}
	return resp, nil
}
