// Package vllm is the real-vLLM end-to-end suite: it builds a small
// Qwen3-architecture model with seeded random weights and the real Qwen3
// tokenizer (mkmodel.py, run by the pinned interpreter of .cache/py/vllm),
// starts real vLLM replicas on 127.0.0.1 with prefix caching and ZMQ KV
// events, puts the EPP in precise mode in front of them, and checks that
// the EPP's index, routing, tokenization, metric scraping and conformance
// verdicts agree with what the running engine reports, and that the engine
// simulator emits the same KV events and metric families. The replicas are
// started once per package (TestMain) and shared by the tests; see
// README.md for how to run it and what it covers.
package vllm
