package extproc

import (
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// routeReply is the routing reply: a ProcessingResponse answering the
// request headers (streamed modes) or the body (BUFFERED), with up to
// three headers of its own and any trace headers. Its header mutation and
// envoy.lb metadata are encoded here, in the wire format proto marshals
// them to, and carried as unknown fields: on the wire the reply is the one
// proto would marshal from the nested messages, but the codec copies bytes
// instead of walking a dozen messages by reflection (BenchmarkRouteReply),
// and builds it in wire without allocating (TestAllocsReplies).
// On headers the bytes are exactly proto's; on a BUFFERED body the fields
// come in another order, which decodes the same.
type routeReply struct {
	resp   extprocv3.ProcessingResponse
	onBody extprocv3.ProcessingResponse_RequestBody
	body   extprocv3.BodyResponse
	common extprocv3.CommonResponse

	set           [5]header // destination, request id, content length, traceparent, tracestate
	n             int
	contentLength [20]byte
	wire          [512]byte // the encoded fields; a longer reply spills to the heap
}

// header is one header the reply sets, replacing the request's.
type header struct {
	key   string
	value []byte
}

// add sets header k: v.
func (r *routeReply) add(k string, v []byte) {
	if r.n == len(r.set) {
		panic("extproc: more headers than routeReply holds") // the callers set at most five
	}
	r.set[r.n] = header{k, v}
	r.n++
}

// onHeaders returns the reply to the request headers: clear_route_cache,
// the headers set and remove, and dest in envoy.lb metadata.
func (r *routeReply) onHeaders(remove []string, dest string) *extprocv3.ProcessingResponse {
	mutation := r.mutationSize(remove)
	common := commonSize(mutation)
	// In proto's order: the oneof comes after the other fields.
	b := appendLBMetadata(r.wire[:0], dest)
	b = appendLen(b, fieldRequestHeaders, protowire.SizeTag(fieldHeadersResponse)+protowire.SizeBytes(common))
	b = appendLen(b, fieldHeadersResponse, common)
	r.resp.Response = nil
	r.resp.ProtoReflect().SetUnknown(r.appendCommon(b, remove, mutation))
	return &r.resp
}

// onRequestBody returns the reply to a BUFFERED body: as onHeaders, and
// the body replaced by m when m is not nil. The body stays a message
// field: encoding it here would copy it once more (TestAllocsReplies).
func (r *routeReply) onRequestBody(remove []string, dest string, m *extprocv3.BodyMutation) *extprocv3.ProcessingResponse {
	common := r.appendCommon(r.wire[:0], remove, r.mutationSize(remove))
	r.common.BodyMutation = m
	r.common.ProtoReflect().SetUnknown(common)
	r.body.Response = &r.common
	r.onBody.RequestBody = &r.body
	r.resp.Response = &r.onBody
	// The metadata goes after the common fields, in the same array.
	r.resp.ProtoReflect().SetUnknown(appendLBMetadata(common[len(common):], dest))
	return &r.resp
}

// mutationSize is the size of the HeaderMutation setting the headers added
// and removing remove.
func (r *routeReply) mutationSize(remove []string) int {
	size := 0
	for _, h := range r.set[:r.n] {
		size += protowire.SizeTag(fieldSetHeaders) + protowire.SizeBytes(h.optionSize())
	}
	for _, k := range remove {
		size += protowire.SizeTag(fieldRemoveHeaders) + protowire.SizeBytes(len(k))
	}
	return size
}

// commonSize is the size of what appendCommon appends, given the header
// mutation's size.
func commonSize(mutation int) int {
	n := protowire.SizeTag(fieldClearRouteCache) + protowire.SizeVarint(1)
	if mutation > 0 {
		n += protowire.SizeTag(fieldHeaderMutation) + protowire.SizeBytes(mutation)
	}
	return n
}

// appendCommon appends the CommonResponse fields header_mutation (the
// headers added, overwriting the request's, and remove; size is
// mutationSize(remove)) and clear_route_cache.
func (r *routeReply) appendCommon(b []byte, remove []string, size int) []byte {
	if size > 0 {
		b = appendLen(b, fieldHeaderMutation, size)
		for _, h := range r.set[:r.n] {
			b = appendLen(b, fieldSetHeaders, h.optionSize())
			b = appendLen(b, fieldOptionHeader, h.valueSize())
			if h.key != "" {
				b = protowire.AppendString(protowire.AppendTag(b, fieldHeaderKey, protowire.BytesType), h.key)
			}
			if len(h.value) > 0 {
				b = protowire.AppendBytes(protowire.AppendTag(b, fieldHeaderRawValue, protowire.BytesType), h.value)
			}
			b = protowire.AppendTag(b, fieldAppendAction, protowire.VarintType)
			b = protowire.AppendVarint(b, uint64(corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD))
		}
		for _, k := range remove {
			b = protowire.AppendString(protowire.AppendTag(b, fieldRemoveHeaders, protowire.BytesType), k)
		}
	}
	b = protowire.AppendTag(b, fieldClearRouteCache, protowire.VarintType)
	return protowire.AppendVarint(b, 1)
}

// valueSize is the size of h's HeaderValue; proto3 leaves out empty fields.
func (h header) valueSize() int {
	n := 0
	if h.key != "" {
		n += protowire.SizeTag(fieldHeaderKey) + protowire.SizeBytes(len(h.key))
	}
	if len(h.value) > 0 {
		n += protowire.SizeTag(fieldHeaderRawValue) + protowire.SizeBytes(len(h.value))
	}
	return n
}

// optionSize is the size of h's HeaderValueOption.
func (h header) optionSize() int {
	return protowire.SizeTag(fieldOptionHeader) + protowire.SizeBytes(h.valueSize()) +
		protowire.SizeTag(fieldAppendAction) + protowire.SizeVarint(uint64(corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD))
}

// appendLen appends the tag and length of a length-delimited field n.
func appendLen(b []byte, n protowire.Number, size int) []byte {
	return protowire.AppendVarint(protowire.AppendTag(b, n, protowire.BytesType), uint64(size))
}

// fieldNumber is the number of m's field name; it panics, at start-up, if
// go-control-plane renamed it.
func fieldNumber(m proto.Message, name protoreflect.Name) protowire.Number {
	f := m.ProtoReflect().Descriptor().Fields().ByName(name)
	if f == nil {
		panic("extproc: " + string(m.ProtoReflect().Descriptor().FullName()) + " has no field " + string(name))
	}
	return f.Number()
}

// Field numbers of the messages the routing reply is encoded from.
var (
	fieldRequestHeaders  = fieldNumber(&extprocv3.ProcessingResponse{}, "request_headers")
	dynamicMetadata      = fieldNumber(&extprocv3.ProcessingResponse{}, "dynamic_metadata")
	fieldHeadersResponse = fieldNumber(&extprocv3.HeadersResponse{}, "response")
	fieldHeaderMutation  = fieldNumber(&extprocv3.CommonResponse{}, "header_mutation")
	fieldClearRouteCache = fieldNumber(&extprocv3.CommonResponse{}, "clear_route_cache")
	fieldSetHeaders      = fieldNumber(&extprocv3.HeaderMutation{}, "set_headers")
	fieldRemoveHeaders   = fieldNumber(&extprocv3.HeaderMutation{}, "remove_headers")
	fieldOptionHeader    = fieldNumber(&corev3.HeaderValueOption{}, "header")
	fieldAppendAction    = fieldNumber(&corev3.HeaderValueOption{}, "append_action")
	fieldHeaderKey       = fieldNumber(&corev3.HeaderValue{}, "key")
	fieldHeaderRawValue  = fieldNumber(&corev3.HeaderValue{}, "raw_value")
)

// Field numbers of google.protobuf.Struct and Value, fixed by the
// well-known types.
const (
	structFields     = 1 // Struct.fields: map<string, Value>
	mapKey, mapValue = 1, 2
	valueString      = 3 // Value.string_value
	valueStruct      = 5 // Value.struct_value
)

// appendLBMetadata appends to b the ProcessingResponse field
// dynamic_metadata holding lbMetadata(dest), in the wire format proto
// marshals it to; a response carrying it as unknown fields is, on the
// wire, one whose DynamicMetadata is lbMetadata(dest).
func appendLBMetadata(b []byte, dest string) []byte {
	entrySize := func(key string, value int) int {
		return protowire.SizeTag(mapKey) + protowire.SizeBytes(len(key)) + protowire.SizeTag(mapValue) + protowire.SizeBytes(value)
	}
	// Message sizes, from the inside out.
	destValue := protowire.SizeTag(valueString) + protowire.SizeBytes(len(dest))
	destEntry := entrySize(HeaderDestination, destValue)
	lbStruct := protowire.SizeTag(structFields) + protowire.SizeBytes(destEntry)
	lbValue := protowire.SizeTag(valueStruct) + protowire.SizeBytes(lbStruct)
	lbEntry := entrySize(MetadataLB, lbValue)
	md := protowire.SizeTag(structFields) + protowire.SizeBytes(lbEntry)

	b = appendLen(b, dynamicMetadata, md)
	b = appendLen(b, structFields, lbEntry)
	b = protowire.AppendString(protowire.AppendTag(b, mapKey, protowire.BytesType), MetadataLB)
	b = appendLen(b, mapValue, lbValue)
	b = appendLen(b, valueStruct, lbStruct)
	b = appendLen(b, structFields, destEntry)
	b = protowire.AppendString(protowire.AppendTag(b, mapKey, protowire.BytesType), HeaderDestination)
	b = appendLen(b, mapValue, destValue)
	return protowire.AppendString(protowire.AppendTag(b, valueString, protowire.BytesType), dest)
}

// chunkReply is the message sendBody sends each body chunk in, built in
// place (TestAllocsReplies).
type chunkReply struct {
	resp     extprocv3.ProcessingResponse
	onReq    extprocv3.ProcessingResponse_RequestBody
	onResp   extprocv3.ProcessingResponse_ResponseBody
	body     extprocv3.BodyResponse
	common   extprocv3.CommonResponse
	mutation extprocv3.BodyMutation
	streamed extprocv3.BodyMutation_StreamedResponse
	chunk    extprocv3.StreamedBodyResponse
}

// message returns the reply for chunk b of the request's (request) or the
// response's body.
func (c *chunkReply) message(b []byte, eos, request bool) *extprocv3.ProcessingResponse {
	if c.body.Response == nil {
		c.streamed.StreamedResponse = &c.chunk
		c.mutation.Mutation = &c.streamed
		c.common.BodyMutation = &c.mutation
		c.body.Response = &c.common
		c.onReq.RequestBody, c.onResp.ResponseBody = &c.body, &c.body
	}
	c.chunk.Body, c.chunk.EndOfStream = b, eos
	if request {
		c.resp.Response = &c.onReq
	} else {
		c.resp.Response = &c.onResp
	}
	return &c.resp
}

// sendBody emits b as streamed_response chunks of at most ChunkSize bytes
// (FULL_DUPLEX_STREAMED). An empty b still sends one message when it
// carries end of stream.
func (st *stream) sendBody(b []byte, eos, request bool) error {
	return EachChunk(b, eos, st.s.cfg.ChunkSize, func(c []byte, eos bool) error {
		return st.send(st.chunk.message(c, eos, request))
	})
}

// EachChunk calls send with b's chunks of at most size bytes, in order,
// the last with eos, as the EPP sends a body back to Envoy; it stops at
// send's first error. An empty b is one chunk when it carries end of
// stream, none otherwise. testgw's floors send with it, so they chunk as
// the EPP does (TestFloorChunks).
func EachChunk(b []byte, eos bool, size int, send func(chunk []byte, eos bool) error) error {
	for first := true; first || len(b) > 0; first = false {
		n := min(len(b), size)
		last := n == len(b)
		if n == 0 && !(eos && last) {
			return nil
		}
		if err := send(b[:n], eos && last); err != nil {
			return err
		}
		b = b[n:]
	}
	return nil
}

func setHeader(k, v string) *corev3.HeaderValueOption {
	return &corev3.HeaderValueOption{
		Header:       &corev3.HeaderValue{Key: k, RawValue: []byte(v)},
		AppendAction: corev3.HeaderValueOption_OVERWRITE_IF_EXISTS_OR_ADD,
	}
}
