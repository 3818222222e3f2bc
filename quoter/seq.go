package quoter

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"sync"

	"github.com/ethereum/go-ethereum/common"
)

// SeqStore hands out strictly increasing quote sequence numbers per
// provider and model and persists them before they are used, so a restart
// (or a crash right after signing) can never reuse a number.
type SeqStore struct {
	path string
	mu   sync.Mutex
	last map[string]uint64
}

type seqState struct {
	Version int               `json:"version"`
	Seq     map[string]uint64 `json:"seq"`
}

// OpenSeqStore loads path, or starts empty when it does not exist yet.
func OpenSeqStore(path string) (*SeqStore, error) {
	s := &SeqStore{path: path, last: map[string]uint64{}}
	b, err := os.ReadFile(path)
	if errors.Is(err, fs.ErrNotExist) {
		return s, nil
	}
	if err != nil {
		return nil, fmt.Errorf("cannot read sequence state: %w", err)
	}
	var st seqState
	if err := json.Unmarshal(b, &st); err != nil {
		// Refuse rather than restart from zero: a reset seq would make the
		// market discard every new quote as a replay.
		return nil, fmt.Errorf("cannot parse sequence state %s (fix or restore it; deleting it resets seq): %w", path, err)
	}
	if st.Version != 1 {
		return nil, fmt.Errorf("sequence state %s has version %d, want 1", path, st.Version)
	}
	for k, v := range st.Seq {
		s.last[k] = v
	}
	return s, nil
}

func seqKey(provider common.Address, model string) string {
	return strings.ToLower(provider.Hex()) + "|" + model
}

// Last returns the last handed-out number (0 when none).
func (s *SeqStore) Last(provider common.Address, model string) uint64 {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.last[seqKey(provider, model)]
}

// Next persists and returns the next number; on a write error nothing is
// handed out and the in-memory state is unchanged.
func (s *SeqStore) Next(provider common.Address, model string) (uint64, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	k := seqKey(provider, model)
	n := s.last[k] + 1
	if n == 0 {
		return 0, fmt.Errorf("sequence for %s exhausted", k)
	}
	st := seqState{Version: 1, Seq: make(map[string]uint64, len(s.last)+1)}
	for key, v := range s.last {
		st.Seq[key] = v
	}
	st.Seq[k] = n
	if err := writeFileAtomic(s.path, st); err != nil {
		return 0, err
	}
	s.last[k] = n
	return n, nil
}

// writeFileAtomic writes v as JSON to a temporary file in the same
// directory, fsyncs it, renames it over path and fsyncs the directory, so
// a crash leaves either the old or the new state, never a torn file.
func writeFileAtomic(path string, v any) error {
	b, err := json.MarshalIndent(v, "", "  ")
	if err != nil {
		return fmt.Errorf("cannot encode state: %w", err)
	}
	dir := filepath.Dir(path)
	f, err := os.CreateTemp(dir, "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("cannot create temporary state file: %w", err)
	}
	tmp := f.Name()
	ok := false
	defer func() {
		if !ok {
			_ = os.Remove(tmp)
		}
	}()
	if _, err := f.Write(append(b, '\n')); err != nil {
		f.Close()
		return fmt.Errorf("cannot write state: %w", err)
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return fmt.Errorf("cannot fsync state: %w", err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("cannot close state: %w", err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return fmt.Errorf("cannot replace state file: %w", err)
	}
	ok = true
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("cannot open state directory: %w", err)
	}
	defer d.Close()
	if err := d.Sync(); err != nil {
		return fmt.Errorf("cannot fsync state directory: %w", err)
	}
	return nil
}
