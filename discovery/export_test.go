package discovery

import (
	"fmt"

	"github.com/omnious/provider-node/endpoint"
)

// LoadFile reads and parses an endpoint file as File.Run does at start.
func LoadFile(path string) ([]endpoint.Endpoint, error) {
	data, err := readLimited(path)
	if err != nil {
		return nil, err
	}
	eps, err := ParseFile(data)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return eps, nil
}
