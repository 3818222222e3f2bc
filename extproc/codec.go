package extproc

import (
	"fmt"

	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
)

// Codec is gRPC's proto codec over a buffer pool of the caller's choice.
// gRPC's own codec always uses the process-wide default pool, whose tiers
// jump from 32 KiB to 1 MiB and which zeroes whole buffers: every
// body-sized ext_proc message then cleared a megabyte, most of the cost of
// a 32 KiB exchange. TestAllocsCodec keeps a body-sized message in the
// pool.
type Codec struct{ pool mem.BufferPool }

var _ encoding.CodecV2 = Codec{}

// NewCodec returns a proto codec drawing buffers from pool.
func NewCodec(pool mem.BufferPool) Codec { return Codec{pool: pool} }

// Name implements encoding.CodecV2; it replaces "proto" for the RPCs that
// use it.
func (Codec) Name() string { return "proto" }

// Marshal implements encoding.CodecV2.
func (c Codec) Marshal(v any) (mem.BufferSlice, error) {
	m, ok := v.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("cannot marshal %T: not a proto message", v)
	}
	size := proto.Size(m)
	if mem.IsBelowBufferPoolingThreshold(size) {
		b, err := proto.Marshal(m)
		if err != nil {
			return nil, err
		}
		return mem.BufferSlice{mem.SliceBuffer(b)}, nil
	}
	buf := c.pool.Get(size)
	b, err := proto.MarshalOptions{UseCachedSize: true}.MarshalAppend((*buf)[:0], m)
	if err != nil {
		c.pool.Put(buf)
		return nil, err
	}
	*buf = b
	return mem.BufferSlice{mem.NewBuffer(buf, c.pool)}, nil
}

// Unmarshal implements encoding.CodecV2.
func (c Codec) Unmarshal(data mem.BufferSlice, v any) error {
	m, ok := v.(proto.Message)
	if !ok {
		return fmt.Errorf("cannot unmarshal into %T: not a proto message", v)
	}
	buf := data.MaterializeToBuffer(c.pool)
	defer buf.Free()
	return proto.Unmarshal(buf.ReadOnlyData(), m)
}
