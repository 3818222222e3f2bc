package extproc

import (
	"encoding/json"
	"net/http"
	"strconv"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	extprocv3 "github.com/envoyproxy/go-control-plane/envoy/service/ext_proc/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"go.uber.org/zap"

	"github.com/omnious/provider-node/engines/openai"
)

// immediateResponse builds the EPP's own answer to the client. The
// reference EPP sends "inference error: <Code> - <msg>" as plain text; we
// send the OpenAI error object instead, because the clients are OpenAI
// SDKs that parse it, and put the machine-readable reason in
// x-omnious-epp-reason (and in Details, which Envoy logs).
func immediateResponse(code int, reason, msg string) *extprocv3.ImmediateResponse {
	body, _ := json.Marshal(openai.ErrorResponse{Error: openai.ErrorBody{Message: msg, Type: errorType(code), Code: code}})
	return &extprocv3.ImmediateResponse{
		Status: &typev3.HttpStatus{Code: typev3.StatusCode(code)},
		Headers: &extprocv3.HeaderMutation{SetHeaders: []*corev3.HeaderValueOption{
			setHeader(headerContentType, "application/json"),
			setHeader(HeaderReason, reason),
			setHeader(headerContentLen, strconv.Itoa(len(body))),
		}},
		Body:    body,
		Details: "epp_" + reason,
	}
}

// errorType names errors as vLLM's OpenAI server does.
func errorType(code int) string {
	switch code {
	case http.StatusBadRequest:
		return "BadRequestError"
	case http.StatusNotFound:
		return "NotFoundError"
	case http.StatusRequestTimeout:
		return "RequestTimeout"
	case http.StatusRequestEntityTooLarge:
		return "RequestEntityTooLarge"
	case http.StatusTooManyRequests:
		return "TooManyRequests"
	case http.StatusServiceUnavailable:
		return "ServiceUnavailable"
	}
	if code >= 500 {
		return "InternalServerError"
	}
	return http.StatusText(code)
}

// reject answers the client directly with an OpenAI-style error.
func (st *stream) reject(code int, reason, msg string) error {
	st.phase = phaseDone
	st.end = "immediate"
	st.rejected, st.rejectReason = code, reason
	cl, tl := st.modelLabels()
	st.s.m.errors.WithLabelValues(cl, tl, reason).Inc()
	if ce := st.s.log.Check(zap.DebugLevel, "rejected"); ce != nil {
		ce.Write(zap.String("id", st.id), zap.Int("status", code), zap.String("reason", reason), zap.String("msg", msg))
	}
	return st.send(&extprocv3.ProcessingResponse{Response: &extprocv3.ProcessingResponse_ImmediateResponse{
		ImmediateResponse: immediateResponse(code, reason, msg)}})
}
