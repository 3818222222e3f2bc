package kvindex

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"

	"github.com/cespare/xxhash/v2"

	"github.com/omnious/provider-node/engines/kvevents"
)

// A snapshot hands the replicas an EPP follows to a sibling EPP that starts,
// so it routes precisely at once instead of learning only what engines store
// after its start. Keys are seeded per process and never leave it, so a
// snapshot carries what they are computed from: per replica, every block's
// engine hash, its parent's engine hash, its token ids and its tiers, in an
// order where a parent comes before its children. The receiver recomputes
// its own keys.
//
// Format (version 2), all integers big-endian or unsigned varints:
//
//	preamble  "OMKVSNAP" | version uint16
//	frame     kind byte | length uint32 | payload | CRC-32C of kind, length and payload
//	'H'       block size uvarint | pool string
//	'R'       name string | model string | seq uint64 | payload sum uint64 |
//	          stride uvarint | group varint | has group byte | blocks uvarint
//	'B'       records, each whole in its frame:
//	          flags byte (bits 0-2 tiers, 3 has parent, 4 root adapter or salt,
//	          5 the parent is the replica's previous record) |
//	          hash uint64 | [parent uint64 unless bit 5] | [adapter string | salt string] |
//	          stride tokens uvarint
//	'T'       replicas uvarint | blocks uvarint | xxhash64 of every byte before this frame
//
// A string is a uvarint length (at most 4096) and its bytes. The stream is
// a preamble, one 'H', for each replica one 'R' followed by 'B' frames
// holding exactly its blocks, one 'T', and nothing after. Frames are at
// most 1 MiB. The checksums find corruption, the trailer's counts and hash
// a frame lost, repeated or reordered, and its absence a truncation.
//
// Version 1 is version 2 without bit 5: every child carries its parent's
// hash, 8 bytes a block of the 63 of a 16-token block. The writer emits
// chains parent first, so most blocks follow their parent; version 2
// leaves that hash out (TestSnapshotParentElided). Both are read.

const (
	snapshotMagic = "OMKVSNAP"
	// SnapshotVersion is the format version written; it and
	// snapshotVersion1 are read.
	SnapshotVersion  = 2
	snapshotVersion1 = 1
	// SnapshotPath is where an EPP serves its snapshot, on the admin port.
	SnapshotPath = "/debug/index/snapshot"
	// SnapshotVersionParam is the query parameter a reader names the
	// newest format it reads with. Without it the server writes version 1,
	// which every EPP reads, so siblings of two releases warm-start each
	// other during a rolling upgrade (TestSnapshotVersionAsked).
	SnapshotVersionParam = "version"

	maxSnapshotFrame = 1 << 20
	// targetBlockFrame is where the writer ends a 'B' frame.
	targetBlockFrame  = 64 << 10
	maxSnapshotString = 4096
	// maxSnapshotStride bounds a block's tokens (vLLM's largest block
	// sizes, for hybrid models, are below 1,000).
	maxSnapshotStride = 1 << 16
	frameHeadLen      = 5
	frameCRCLen       = 4

	frameHeader  = 'H'
	frameReplica = 'R'
	frameBlocks  = 'B'
	frameTrailer = 'T'

	recTierMask     = 0x07
	recHasParent    = 0x08
	recRootSpec     = 0x10
	recPrevIsParent = 0x20 // version 2
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Errors of a snapshot that cannot be loaded; the error text says more.
var (
	// ErrSnapshotCorrupt: a checksum, a count or the structure is wrong.
	ErrSnapshotCorrupt = errors.New("corrupt index snapshot")
	// ErrSnapshotTruncated: the stream ended before its trailer.
	ErrSnapshotTruncated = errors.New("truncated index snapshot")
	// ErrSnapshotForeign: another format version, block size or pool.
	ErrSnapshotForeign = errors.New("foreign index snapshot")
	// ErrSnapshotTooLarge: more bytes, or a replica with more blocks, than
	// the reader accepts.
	ErrSnapshotTooLarge = errors.New("index snapshot too large")
)

// SnapshotHeader is what a snapshot must agree on with its reader.
type SnapshotHeader struct {
	// BlockSize is the sender's block size (the scheduler's).
	BlockSize int
	// Pool names the pool the sender serves ("namespace/name" of an
	// InferencePool, "" for a static endpoint file).
	Pool string
}

// ReplicaTag says where a replica's state stands: its endpoint address and
// the position of the last batch applied to it.
type ReplicaTag struct {
	Name string
	Pos  kvevents.Position
}

// SnapshotWriter streams a snapshot. The caller adds replicas one at a time,
// holding whatever keeps each ReplicaState still while AddReplica encodes it
// into memory, and flushes between them without that lock: the writer holds
// at most one replica's encoding (about 60 bytes per block) before a Flush.
type SnapshotWriter struct {
	w      io.Writer
	buf    []byte // encoded, not yet written
	body   []byte // the current replica's 'B' frames
	frame  []byte // the current 'B' frame's payload
	digest *xxhash.Digest
	err    error

	replicas, blocks, skipped int

	stack  []walkStep
	orphan map[uint64]bool
	marks  []uint8 // see walk

	// version is SnapshotVersion but in tests; prev is the hash of the
	// replica's last record, hasPrev whether it has one.
	version uint16
	prev    uint64
	hasPrev bool
}

// NewSnapshotWriter starts a snapshot on w; nothing is written before Flush.
func NewSnapshotWriter(w io.Writer, h SnapshotHeader) *SnapshotWriter {
	return newSnapshotWriter(w, h, SnapshotVersion)
}

// NewSnapshotWriterVersion is NewSnapshotWriter in an older format the
// reader asked for (SnapshotVersionParam); it refuses a version it cannot
// write.
func NewSnapshotWriterVersion(w io.Writer, h SnapshotHeader, version int) (*SnapshotWriter, error) {
	if version != snapshotVersion1 && version != SnapshotVersion {
		return nil, fmt.Errorf("snapshot format version %d: this EPP writes %d and %d", version, snapshotVersion1, SnapshotVersion)
	}
	return newSnapshotWriter(w, h, uint16(version)), nil
}

func newSnapshotWriter(w io.Writer, h SnapshotHeader, version uint16) *SnapshotWriter {
	sw := &SnapshotWriter{w: w, digest: xxhash.New(), version: version}
	sw.buf = append(sw.buf, snapshotMagic...)
	sw.buf = binary.BigEndian.AppendUint16(sw.buf, version)
	var p []byte
	p = binary.AppendUvarint(p, uint64(max(h.BlockSize, 0)))
	p = appendString(p, h.Pool)
	sw.buf = appendFrame(sw.buf, frameHeader, p)
	_, _ = sw.digest.Write(sw.buf)
	return sw
}

// AddReplica encodes s, tagged with tag, into the writer's memory. Blocks
// whose ancestors are no longer tracked (their parent was removed while
// they stayed) cannot be rebuilt by the receiver and are left out, as are
// blocks whose adapter or salt is longer than 4096 bytes; Stats counts
// them.
func (sw *SnapshotWriter) AddReplica(tag ReplicaTag, s *ReplicaState) error {
	if sw.err != nil {
		return sw.err
	}
	if len(tag.Name) > maxSnapshotString || len(s.model) > maxSnapshotString {
		return fmt.Errorf("cannot snapshot replica %.64q: name or model longer than %d bytes", tag.Name, maxSnapshotString)
	}
	if s.tokens.stride > maxSnapshotStride {
		return fmt.Errorf("cannot snapshot replica %s: block size %d too large", tag.Name, s.tokens.stride)
	}
	sw.body, sw.frame = sw.body[:0], sw.frame[:0]
	sw.hasPrev = false
	n := s.walk(sw)
	sw.endBlockFrame()

	var p []byte
	p = appendString(p, tag.Name)
	p = appendString(p, s.model)
	p = binary.BigEndian.AppendUint64(p, tag.Pos.Seq)
	p = binary.BigEndian.AppendUint64(p, tag.Pos.Sum)
	p = binary.AppendUvarint(p, uint64(s.tokens.stride))
	p = binary.AppendVarint(p, int64(s.group))
	p = append(p, b2u(s.hasGroup))
	p = binary.AppendUvarint(p, uint64(n))
	start := len(sw.buf)
	sw.buf = appendFrame(sw.buf, frameReplica, p)
	sw.buf = append(sw.buf, sw.body...)
	_, _ = sw.digest.Write(sw.buf[start:])
	sw.replicas++
	sw.blocks += n
	return nil
}

// walk encodes every block of s whose ancestors are all tracked, each after
// its parent, and returns how many. A block's mark, in sw.marks by its
// token slot (unique among the blocks tracked), says whether the walk is
// on its way up through it (visit) or has dealt with it (done); a parent
// met on the way up is a cycle, possible only with hostile hashes.
// Marking there rather than in the map costs a byte a block instead of
// two map writes (BenchmarkSnapshotWrite).
func (s *ReplicaState) walk(sw *SnapshotWriter) int {
	const visit, done = 1, 2
	marks := sw.marks[:0]
	if n := int(s.tokens.used); cap(marks) >= n {
		marks = marks[:n]
		clear(marks)
	} else {
		marks = make([]uint8, n)
	}
	sw.marks = marks
	clear(sw.orphan)
	n := 0
	for h, b := range s.blocks {
		if marks[b.tok] == done {
			continue
		}
		sw.stack = sw.stack[:0]
		orphan := false
		for ch := h; ; {
			marks[b.tok] = visit
			sw.stack = append(sw.stack, walkStep{ch, b})
			if !b.hasParent {
				break
			}
			p, ok := s.blocks[b.parent]
			if !ok || marks[p.tok] == visit {
				orphan = true
				break
			}
			if marks[p.tok] == done {
				orphan = sw.orphan[b.parent]
				break
			}
			ch, b = b.parent, p
		}
		for i := len(sw.stack) - 1; i >= 0; i-- {
			ch, b := sw.stack[i].hash, sw.stack[i].b
			marks[b.tok] = done
			var root rootSpec
			if !b.hasParent {
				root = s.roots[ch]
			}
			if !orphan && (b.opaque || len(root.lora) > maxSnapshotString || len(root.salt) > maxSnapshotString) {
				orphan = true // its descendants cannot be rebuilt either
			}
			if orphan {
				if sw.orphan == nil {
					sw.orphan = make(map[uint64]bool)
				}
				sw.orphan[ch] = true
				sw.skipped++
				continue
			}
			sw.appendRecord(ch, b, root, s.tokens.at(b.tok))
			n++
		}
	}
	return n
}

// walkStep is a block on the walk's way up to its first done ancestor.
type walkStep struct {
	hash uint64
	b    engineBlock
}

func (sw *SnapshotWriter) appendRecord(h uint64, b engineBlock, root rootSpec, toks []uint32) {
	flags := b.tiers & recTierMask
	if b.hasParent {
		flags |= recHasParent
		if sw.hasPrev && sw.prev == b.parent && sw.version >= 2 {
			flags |= recPrevIsParent
		}
	} else if root != (rootSpec{}) {
		flags |= recRootSpec
	}
	sw.prev, sw.hasPrev = h, true
	p := append(sw.frame, flags)
	p = binary.BigEndian.AppendUint64(p, h)
	switch {
	case flags&recPrevIsParent != 0: // the receiver has it: the record before
	case b.hasParent:
		p = binary.BigEndian.AppendUint64(p, b.parent)
	case flags&recRootSpec != 0:
		p = appendString(p, root.lora)
		p = appendString(p, root.salt)
	}
	for _, t := range toks {
		p = binary.AppendUvarint(p, uint64(t))
	}
	sw.frame = p
	if len(sw.frame) >= targetBlockFrame {
		sw.endBlockFrame()
	}
}

func (sw *SnapshotWriter) endBlockFrame() {
	if len(sw.frame) > 0 {
		sw.body = appendFrame(sw.body, frameBlocks, sw.frame)
		sw.frame = sw.frame[:0]
	}
}

// Flush writes what is encoded.
func (sw *SnapshotWriter) Flush() error {
	if sw.err != nil {
		return sw.err
	}
	if len(sw.buf) > 0 {
		if _, err := sw.w.Write(sw.buf); err != nil {
			sw.err = fmt.Errorf("cannot write index snapshot: %w", err)
			return sw.err
		}
	}
	sw.buf = sw.buf[:0]
	if cap(sw.buf) > 4*targetBlockFrame {
		sw.buf = nil // one large replica does not pin its buffer
	}
	return nil
}

// Close writes the trailer and flushes. A snapshot without it is refused.
func (sw *SnapshotWriter) Close() error {
	if sw.err != nil {
		return sw.err
	}
	var p []byte
	p = binary.AppendUvarint(p, uint64(sw.replicas))
	p = binary.AppendUvarint(p, uint64(sw.blocks))
	p = binary.BigEndian.AppendUint64(p, sw.digest.Sum64())
	sw.buf = appendFrame(sw.buf, frameTrailer, p)
	err := sw.Flush()
	sw.err = errors.New("index snapshot closed")
	return err
}

// Stats returns the replicas and blocks written so far, and the blocks
// left out (see AddReplica).
func (sw *SnapshotWriter) Stats() (replicas, blocks, skipped int) {
	return sw.replicas, sw.blocks, sw.skipped
}

func appendFrame(dst []byte, kind byte, payload []byte) []byte {
	start := len(dst)
	dst = append(dst, kind)
	dst = binary.BigEndian.AppendUint32(dst, uint32(len(payload)))
	dst = append(dst, payload...)
	return binary.BigEndian.AppendUint32(dst, crc32.Checksum(dst[start:], castagnoli))
}

func appendString(dst []byte, s string) []byte {
	dst = binary.AppendUvarint(dst, uint64(len(s)))
	return append(dst, s...)
}

func b2u(b bool) byte {
	if b {
		return 1
	}
	return 0
}

// ReplicaSection is one replica of a snapshot, as SnapshotReader reads it.
type ReplicaSection struct {
	ReplicaTag
	Model string
	// BlockSize is the tokens per block of the replica's blocks.
	BlockSize int
	// Group is the KV group the replica's state follows, if HasGroup.
	Group    int
	HasGroup bool
	// Blocks is how many blocks follow.
	Blocks int
}

// SnapshotBlock is one block of a replica section. Tokens is reused by the
// next call to NextBlock.
type SnapshotBlock struct {
	Hash      uint64
	Parent    uint64
	HasParent bool
	// Lora and Salt are a root block's adapter and cache salt.
	Lora, Salt string
	Tokens     []uint32
	// Tiers is a bitmask of Tier, never 0.
	Tiers uint8
}

// SnapshotReader reads a snapshot as a stream, checking every frame, in
// memory bounded by one frame (1 MiB) whatever the snapshot's size. Only
// the io.EOF of NextReplica says the snapshot was whole and verified.
type SnapshotReader struct {
	r      *bufio.Reader
	lim    *limitReader
	digest *xxhash.Digest
	hdr    SnapshotHeader

	frame   []byte // payload of the current frame
	rest    []byte // unread records of the current 'B' frame
	version uint16
	// prev is the hash of the section's last record, if hasPrev.
	prev    uint64
	hasPrev bool
	sec     ReplicaSection
	pending int // blocks of sec not yet read
	names   map[string]bool
	blocks  int
	done    bool
	err     error
	blk     SnapshotBlock
}

// NewSnapshotReader reads the preamble and header of a snapshot of at most
// maxBytes bytes (0: no limit).
func NewSnapshotReader(r io.Reader, maxBytes int64) (*SnapshotReader, error) {
	sr := &SnapshotReader{lim: &limitReader{r: r, max: maxBytes}, digest: xxhash.New(), names: map[string]bool{}}
	sr.r = bufio.NewReaderSize(sr.lim, 16<<10)
	var pre [len(snapshotMagic) + 2]byte
	if _, err := io.ReadFull(sr.r, pre[:]); err != nil {
		return nil, sr.readErr(err, "preamble")
	}
	if string(pre[:len(snapshotMagic)]) != snapshotMagic {
		return nil, fmt.Errorf("%w: not an index snapshot (bad magic %q)", ErrSnapshotForeign, pre[:len(snapshotMagic)])
	}
	sr.version = binary.BigEndian.Uint16(pre[len(snapshotMagic):])
	if sr.version != SnapshotVersion && sr.version != snapshotVersion1 {
		return nil, fmt.Errorf("%w: format version %d, this EPP reads %d and %d", ErrSnapshotForeign, sr.version,
			snapshotVersion1, SnapshotVersion)
	}
	_, _ = sr.digest.Write(pre[:])
	kind, err := sr.readFrame()
	if err != nil {
		return nil, err
	}
	if kind != frameHeader {
		return nil, fmt.Errorf("%w: first frame is %q, want the header", ErrSnapshotCorrupt, kind)
	}
	d := decoder{b: sr.frame}
	bs := d.uvarint()
	sr.hdr = SnapshotHeader{BlockSize: int(bs), Pool: d.str()}
	if err := d.end("header"); err != nil {
		return nil, err
	}
	if bs == 0 || bs > 1<<20 {
		return nil, fmt.Errorf("%w: block size %d", ErrSnapshotCorrupt, bs)
	}
	return sr, nil
}

// Header returns the snapshot's header.
func (sr *SnapshotReader) Header() SnapshotHeader { return sr.hdr }

// NextReplica skips what is left of the current section and returns the
// next one, or io.EOF once the trailer is read and verified and nothing
// follows it.
func (sr *SnapshotReader) NextReplica() (ReplicaSection, error) {
	for sr.err == nil && sr.pending > 0 {
		_, _ = sr.NextBlock()
	}
	if sr.err != nil {
		return ReplicaSection{}, sr.err
	}
	if sr.done {
		return ReplicaSection{}, io.EOF
	}
	kind, err := sr.readFrame()
	if err != nil {
		return ReplicaSection{}, sr.fail(err)
	}
	switch kind {
	case frameTrailer:
		return ReplicaSection{}, sr.fail(sr.trailer())
	case frameReplica:
	default:
		return ReplicaSection{}, sr.fail(fmt.Errorf("%w: frame %q where a replica or the trailer belongs", ErrSnapshotCorrupt, kind))
	}
	d := decoder{b: sr.frame}
	var sec ReplicaSection
	sec.Name, sec.Model = d.str(), d.str()
	sec.Pos.Seq, sec.Pos.Sum = d.u64(), d.u64()
	stride, group := d.uvarint(), d.varint()
	hasGroup, blocks := d.byte(), d.uvarint()
	if err := d.end("replica"); err != nil {
		return ReplicaSection{}, sr.fail(err)
	}
	switch {
	case sec.Name == "":
		err = fmt.Errorf("%w: replica without a name", ErrSnapshotCorrupt)
	case sr.names[sec.Name]:
		err = fmt.Errorf("%w: replica %s twice", ErrSnapshotCorrupt, sec.Name)
	case hasGroup > 1 || group < -1<<31 || group > 1<<31-1:
		err = fmt.Errorf("%w: replica %s: bad KV group", ErrSnapshotCorrupt, sec.Name)
	case stride > maxSnapshotStride || (stride == 0 && blocks > 0):
		err = fmt.Errorf("%w: replica %s: block size %d", ErrSnapshotCorrupt, sec.Name, stride)
	case blocks > 1<<31:
		err = fmt.Errorf("%w: replica %s: %d blocks", ErrSnapshotTooLarge, sec.Name, blocks)
	}
	if err != nil {
		return ReplicaSection{}, sr.fail(err)
	}
	sr.names[sec.Name] = true
	sec.BlockSize, sec.Group, sec.HasGroup, sec.Blocks = int(stride), int(group), hasGroup == 1, int(blocks)
	sr.sec, sr.pending, sr.hasPrev = sec, sec.Blocks, false
	if cap(sr.blk.Tokens) < sec.BlockSize {
		sr.blk.Tokens = make([]uint32, sec.BlockSize)
	}
	sr.blk.Tokens = sr.blk.Tokens[:sec.BlockSize]
	return sec, nil
}

// NextBlock returns the current section's next block, or io.EOF after its
// last.
func (sr *SnapshotReader) NextBlock() (*SnapshotBlock, error) {
	if sr.err != nil {
		return nil, sr.err
	}
	if sr.pending == 0 {
		if len(sr.rest) > 0 {
			return nil, sr.fail(fmt.Errorf("%w: replica %s: records past its %d blocks", ErrSnapshotCorrupt, sr.sec.Name, sr.sec.Blocks))
		}
		return nil, io.EOF
	}
	if len(sr.rest) == 0 {
		kind, err := sr.readFrame()
		if err != nil {
			return nil, sr.fail(err)
		}
		if kind != frameBlocks || len(sr.frame) == 0 {
			return nil, sr.fail(fmt.Errorf("%w: replica %s: frame %q after %d of its %d blocks", ErrSnapshotCorrupt,
				sr.sec.Name, kind, sr.sec.Blocks-sr.pending, sr.sec.Blocks))
		}
		sr.rest = sr.frame
	}
	d := decoder{b: sr.rest}
	flags := d.byte()
	b := &sr.blk
	b.Tiers = flags & recTierMask
	b.HasParent = flags&recHasParent != 0
	b.Hash = d.u64()
	b.Parent, b.Lora, b.Salt = 0, "", ""
	switch {
	case flags&recPrevIsParent != 0:
		b.Parent = sr.prev
	case b.HasParent:
		b.Parent = d.u64()
	case flags&recRootSpec != 0:
		b.Lora, b.Salt = d.str(), d.str()
	}
	d.tokens(b.Tokens)
	switch {
	case d.bad:
		return nil, sr.fail(fmt.Errorf("%w: replica %s: block %d cut short or malformed", ErrSnapshotCorrupt, sr.sec.Name, sr.sec.Blocks-sr.pending))
	case b.Tiers == 0 || flags&^(recTierMask|recHasParent|recRootSpec|recPrevIsParent) != 0 || (b.HasParent && flags&recRootSpec != 0) ||
		(flags&recPrevIsParent != 0 && (!b.HasParent || !sr.hasPrev || sr.version < 2)):
		return nil, sr.fail(fmt.Errorf("%w: replica %s: block %d flags %#x", ErrSnapshotCorrupt, sr.sec.Name, sr.sec.Blocks-sr.pending, flags))
	}
	sr.rest = d.b
	sr.prev, sr.hasPrev = b.Hash, true
	sr.pending--
	sr.blocks++
	if sr.pending == 0 && len(sr.rest) > 0 {
		return nil, sr.fail(fmt.Errorf("%w: replica %s: records past its %d blocks", ErrSnapshotCorrupt, sr.sec.Name, sr.sec.Blocks))
	}
	return b, nil
}

// Bytes returns how many bytes of the snapshot were read.
func (sr *SnapshotReader) Bytes() int64 { return sr.lim.n - int64(sr.r.Buffered()) }

// limitReader counts what it reads and fails past max bytes (0: no limit).
type limitReader struct {
	r      io.Reader
	n, max int64
}

func (l *limitReader) Read(p []byte) (int, error) {
	if l.max > 0 && l.n > l.max {
		return 0, fmt.Errorf("%w: over %d bytes", ErrSnapshotTooLarge, l.max)
	}
	if l.max > 0 && int64(len(p)) > l.max+1-l.n {
		p = p[:l.max+1-l.n]
	}
	k, err := l.r.Read(p)
	l.n += int64(k)
	if l.max > 0 && l.n > l.max {
		return k, fmt.Errorf("%w: over %d bytes", ErrSnapshotTooLarge, l.max)
	}
	return k, err
}

func (sr *SnapshotReader) trailer() error {
	d := decoder{b: sr.frame}
	replicas, blocks, sum := d.uvarint(), d.uvarint(), d.u64()
	if err := d.end("trailer"); err != nil {
		return err
	}
	if replicas != uint64(len(sr.names)) || blocks != uint64(sr.blocks) {
		return fmt.Errorf("%w: trailer counts %d replicas and %d blocks, the stream held %d and %d",
			ErrSnapshotCorrupt, replicas, blocks, len(sr.names), sr.blocks)
	}
	if sum != sr.digest.Sum64() {
		return fmt.Errorf("%w: stream checksum mismatch", ErrSnapshotCorrupt)
	}
	if _, err := sr.r.ReadByte(); err == nil {
		return fmt.Errorf("%w: data after the trailer", ErrSnapshotCorrupt)
	} else if !errors.Is(err, io.EOF) {
		return sr.readErr(err, "end")
	}
	sr.done = true
	return io.EOF
}

// readFrame reads one frame into sr.frame, checks its CRC and, unless it
// is the trailer, adds its bytes to the stream checksum.
func (sr *SnapshotReader) readFrame() (byte, error) {
	var head [frameHeadLen]byte
	if _, err := io.ReadFull(sr.r, head[:]); err != nil {
		return 0, sr.readErr(err, "frame header")
	}
	n := binary.BigEndian.Uint32(head[1:])
	if n > maxSnapshotFrame {
		return 0, fmt.Errorf("%w: frame of %d bytes, over %d", ErrSnapshotCorrupt, n, maxSnapshotFrame)
	}
	if cap(sr.frame) < int(n)+frameCRCLen {
		sr.frame = make([]byte, int(n)+frameCRCLen)
	}
	buf := sr.frame[:int(n)+frameCRCLen]
	if _, err := io.ReadFull(sr.r, buf); err != nil {
		return 0, sr.readErr(err, "frame")
	}
	crc := crc32.Update(crc32.Checksum(head[:], castagnoli), castagnoli, buf[:n])
	if crc != binary.BigEndian.Uint32(buf[n:]) {
		return 0, fmt.Errorf("%w: frame %q checksum mismatch", ErrSnapshotCorrupt, head[0])
	}
	if head[0] != frameTrailer {
		_, _ = sr.digest.Write(head[:])
		_, _ = sr.digest.Write(buf)
	}
	sr.frame = buf[:n]
	return head[0], nil
}

// readErr turns a read error into the snapshot error it means.
func (sr *SnapshotReader) readErr(err error, what string) error {
	if errors.Is(err, ErrSnapshotTooLarge) {
		return err
	}
	if errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) {
		return fmt.Errorf("%w: stream ended in the %s", ErrSnapshotTruncated, what)
	}
	return fmt.Errorf("cannot read index snapshot: %w", err)
}

func (sr *SnapshotReader) fail(err error) error {
	if sr.err == nil && err != nil && !errors.Is(err, io.EOF) {
		sr.err = err
	}
	return err
}

// decoder reads the fields of one frame; a short or malformed field sets
// bad and yields zeros, so callers check once.
type decoder struct {
	b   []byte
	bad bool
}

func (d *decoder) byte() byte {
	if len(d.b) < 1 {
		d.bad = true
		return 0
	}
	v := d.b[0]
	d.b = d.b[1:]
	return v
}

func (d *decoder) u64() uint64 {
	if len(d.b) < 8 {
		d.bad, d.b = true, nil
		return 0
	}
	v := binary.BigEndian.Uint64(d.b)
	d.b = d.b[8:]
	return v
}

func (d *decoder) uvarint() uint64 {
	v, n := binary.Uvarint(d.b)
	if n <= 0 {
		d.bad, d.b = true, nil
		return 0
	}
	d.b = d.b[n:]
	return v
}

// tokens decodes len(dst) uvarints of at most 32 bits into dst, as many
// uvarint calls would (FuzzSnapshotTokens). Token ids below 2^21, every
// vocabulary's, take at most three bytes and are decoded inline: this
// loop is the decoder's hottest (BenchmarkSnapshotLoad).
func (d *decoder) tokens(dst []uint32) {
	b := d.b
	for i := range dst {
		if len(b) >= 3 {
			c0, c1, c2 := b[0], b[1], b[2]
			switch {
			case c0 < 0x80:
				dst[i], b = uint32(c0), b[1:]
				continue
			case c1 < 0x80:
				dst[i], b = uint32(c0&0x7f)|uint32(c1)<<7, b[2:]
				continue
			case c2 < 0x80:
				dst[i], b = uint32(c0&0x7f)|uint32(c1&0x7f)<<7|uint32(c2)<<14, b[3:]
				continue
			}
		}
		v, n := binary.Uvarint(b)
		if n <= 0 || v > 1<<32-1 {
			d.bad, d.b = true, nil
			return
		}
		dst[i], b = uint32(v), b[n:]
	}
	d.b = b
}

func (d *decoder) varint() int64 {
	v, n := binary.Varint(d.b)
	if n <= 0 {
		d.bad, d.b = true, nil
		return 0
	}
	d.b = d.b[n:]
	return v
}

func (d *decoder) str() string {
	n := d.uvarint()
	if n > maxSnapshotString || n > uint64(len(d.b)) {
		d.bad, d.b = true, nil
		return ""
	}
	s := string(d.b[:n])
	d.b = d.b[n:]
	return s
}

// end checks that the frame was read exactly.
func (d *decoder) end(what string) error {
	if d.bad || len(d.b) != 0 {
		return fmt.Errorf("%w: malformed %s frame", ErrSnapshotCorrupt, what)
	}
	return nil
}

// LoadOptions configures LoadSnapshot.
type LoadOptions struct {
	// Index configures the fresh index the snapshot is loaded into.
	Index Config
	// Want is what the snapshot must agree on: a snapshot of another block
	// size or pool is foreign.
	Want SnapshotHeader
	// MaxBytes bounds the snapshot's size. 0: no bound.
	MaxBytes int64
	// Assign gives a replica's name its id (kvindex.IDs.Assign).
	Assign func(name string) (Replica, error)
}

// LoadedReplica is one replica rebuilt from a snapshot: its state writes
// into Snapshot.Index, and its tag says where the engine's stream must be
// resumed from.
type LoadedReplica struct {
	ReplicaTag
	State *ReplicaState
}

// Snapshot is a loaded snapshot.
type Snapshot struct {
	// Index is a fresh index holding every loaded replica and nothing else.
	Index    *Index
	Replicas []LoadedReplica
	Header   SnapshotHeader
	// Blocks is the number of blocks loaded, Bytes the snapshot's size.
	Blocks int
	Bytes  int64
}

// LoadSnapshot reads a whole snapshot into a fresh index. It returns only
// a snapshot that was complete and verified: on any error (see the Err
// variables) nothing it built is reachable, so a bad snapshot never leaves a
// partial index; the caller starts from an empty one instead.
func LoadSnapshot(r io.Reader, o LoadOptions) (*Snapshot, error) {
	sr, err := NewSnapshotReader(r, o.MaxBytes)
	if err != nil {
		return nil, err
	}
	h := sr.Header()
	if h.BlockSize != o.Want.BlockSize {
		return nil, fmt.Errorf("%w: block size %d, this EPP's is %d", ErrSnapshotForeign, h.BlockSize, o.Want.BlockSize)
	}
	if h.Pool != o.Want.Pool {
		return nil, fmt.Errorf("%w: pool %q, this EPP serves %q", ErrSnapshotForeign, h.Pool, o.Want.Pool)
	}
	if o.Assign == nil {
		o.Assign = NewIDs().Assign
	}
	snap := &Snapshot{Index: New(o.Index), Header: h}
	lw := newLoadWriter(snap.Index)
	defer lw.close()
	var pend [NumTiers][]Key
	for {
		sec, err := sr.NextReplica()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, err
		}
		if sec.Blocks > snap.Index.cfg.MaxReplicaBlocks {
			return nil, fmt.Errorf("%w: replica %s has %d blocks, over the %d a replica may track",
				ErrSnapshotTooLarge, sec.Name, sec.Blocks, snap.Index.cfg.MaxReplicaBlocks)
		}
		id, err := o.Assign(sec.Name)
		if err != nil {
			return nil, fmt.Errorf("cannot load replica %s of the index snapshot: %w", sec.Name, err)
		}
		s := NewReplicaState(snap.Index, id, sec.Model)
		s.group, s.hasGroup, s.blockSize = sec.Group, sec.HasGroup, sec.BlockSize
		s.tokens = newTokenStore(sec.BlockSize)
		// Sized for the declared blocks, within a bound: the count is the
		// sender's word until the blocks arrive.
		s.blocks = make(map[uint64]engineBlock, min(sec.Blocks, 1<<16))
		s.w = lw.w
		var cur loadCursor
		for {
			b, err := sr.NextBlock()
			if errors.Is(err, io.EOF) {
				break
			}
			if err != nil {
				return nil, err
			}
			if err := s.load(b, &pend, &cur); err != nil {
				return nil, fmt.Errorf("%w: replica %s: %v", ErrSnapshotCorrupt, sec.Name, err)
			}
			if lw.w.Len() >= loadWrites {
				s.w = lw.next()
			}
		}
		s.flushLoaded(&pend)
		s.w = nil
		snap.Replicas = append(snap.Replicas, LoadedReplica{ReplicaTag: sec.ReplicaTag, State: s})
		snap.Blocks += sec.Blocks
	}
	lw.next()
	lw.close()
	snap.Bytes = sr.Bytes()
	return snap, nil
}

// loadWrites is how many keys LoadSnapshot hands its index writer at once.
const loadWrites = 1 << 16

// loadWriter stores a loading snapshot's keys in its index on a goroutine
// of its own, so that decoding, verifying and keying the next blocks runs
// beside it (BenchmarkSnapshotLoad). Writes are applied in the order
// handed over, so replica after replica, as Index.writeBulk requires.
type loadWriter struct {
	w    *Writes       // being filled
	full chan *Writes  // handed over, applied in order
	free chan *Writes  // applied, to be filled again
	done chan struct{} // closed when the writer has applied everything
	once bool          // close ran
}

func newLoadWriter(ix *Index) *loadWriter {
	lw := &loadWriter{w: new(Writes), full: make(chan *Writes, 1), free: make(chan *Writes, 2), done: make(chan struct{})}
	lw.free <- new(Writes)
	go func() {
		defer close(lw.done)
		var bs bulkStore
		for w := range lw.full {
			ix.writeBulk(w, &bs)
			lw.free <- w
		}
	}()
	return lw
}

// next hands the filled Writes over and returns an empty one to fill,
// waiting while both others are in use.
func (lw *loadWriter) next() *Writes {
	lw.full <- lw.w
	lw.w = <-lw.free
	return lw.w
}

// close waits until everything handed over is applied.
func (lw *loadWriter) close() {
	if !lw.once {
		lw.once = true
		close(lw.full)
		<-lw.done
	}
}

// loadCursor is the replica's last loaded block: most blocks follow their
// parent, whose key is then known without a map lookup.
type loadCursor struct {
	hash uint64
	key  Key
	ok   bool
}

// load adds one snapshot block, whose parent must precede it, and queues
// its key per tier in pend.
func (s *ReplicaState) load(b *SnapshotBlock, pend *[NumTiers][]Key, cur *loadCursor) error {
	var parent Key
	switch {
	case b.HasParent && cur.ok && cur.hash == b.Parent:
		parent = cur.key
	case b.HasParent:
		p, ok := s.blocks[b.Parent]
		if !ok {
			return fmt.Errorf("block %#x before its parent %#x", b.Hash, b.Parent)
		}
		parent = p.key
	default:
		parent = s.rootKey(b.Lora, b.Salt)
	}
	s.keys = AppendBlockKeys(s.keys[:0], parent, b.Tokens, s.tokens.stride)
	nb := engineBlock{key: s.keys[0], parent: b.Parent, hasParent: b.HasParent, tiers: b.Tiers, tok: s.tokens.put(b.Tokens)}
	// One map operation: a block seen before shows as a map that did not
	// grow, and fails the whole load, so what it overwrote does not matter.
	n := len(s.blocks)
	if s.blocks[b.Hash] = nb; len(s.blocks) == n {
		return fmt.Errorf("block %#x twice", b.Hash)
	}
	*cur = loadCursor{hash: b.Hash, key: nb.key, ok: true}
	if !b.HasParent && (b.Lora != "" || b.Salt != "") {
		if s.roots == nil {
			s.roots = make(map[uint64]rootSpec)
		}
		s.roots[b.Hash] = rootSpec{b.Lora, b.Salt}
	}
	for t := Tier(0); t < NumTiers; t++ {
		if b.Tiers&(1<<t) == 0 {
			continue
		}
		if pend[t] = append(pend[t], nb.key); len(pend[t]) == removeChunk {
			s.store(t, pend[t])
			s.stats.StoredBlocks += uint64(len(pend[t]))
			pend[t] = pend[t][:0]
		}
	}
	return nil
}

func (s *ReplicaState) flushLoaded(pend *[NumTiers][]Key) {
	for t := Tier(0); t < NumTiers; t++ {
		s.store(t, pend[t])
		s.stats.StoredBlocks += uint64(len(pend[t]))
		pend[t] = pend[t][:0]
	}
}
