package kvindex

import (
	"errors"
	"math"
	"sync"
)

// IDs hands out replica ids by name (an endpoint's "ip:port") and is the
// only place they come from, so the scheduler's lookups and the KV-event
// ingestion store and match under the same id. A name keeps its id while it
// is assigned. A released id is reused only after every fresh id has been
// handed out, so records keyed by an id that lag behind a release (a
// speculative credit, an approximate route) rarely meet a newcomer.
// Safe for concurrent use.
type IDs struct {
	mu    sync.Mutex
	ids   map[string]Replica
	next  int
	freed []Replica
}

// NewIDs returns an empty allocator.
func NewIDs() *IDs { return &IDs{ids: make(map[string]Replica)} }

// errNoFreeID is returned once every id is in use.
var errNoFreeID = errors.New("no free replica id: every one of 65,536 is in use")

// Assign returns name's id, giving it one if it has none.
func (a *IDs) Assign(name string) (Replica, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if id, ok := a.ids[name]; ok {
		return id, nil
	}
	var id Replica
	switch {
	case a.next <= math.MaxUint16:
		id = Replica(a.next)
		a.next++
	case len(a.freed) > 0:
		id, a.freed = a.freed[0], a.freed[1:]
	default:
		return 0, errNoFreeID
	}
	a.ids[name] = id
	return id, nil
}

// Lookup returns name's id, if it has one.
func (a *IDs) Lookup(name string) (Replica, bool) {
	a.mu.Lock()
	defer a.mu.Unlock()
	id, ok := a.ids[name]
	return id, ok
}

// Retain releases the id of every name for which keep is false, clearing
// the replica's entries from ix (if not nil) before the id can be handed
// out again, so a reused id never inherits blocks. Whoever feeds the index
// under these ids must have stopped doing so for the released names.
func (a *IDs) Retain(keep func(name string) bool, ix *Index) {
	a.mu.Lock()
	defer a.mu.Unlock()
	for name, id := range a.ids {
		if keep(name) {
			continue
		}
		if ix != nil {
			ix.ClearReplica(id)
		}
		delete(a.ids, name)
		a.freed = append(a.freed, id)
	}
}
