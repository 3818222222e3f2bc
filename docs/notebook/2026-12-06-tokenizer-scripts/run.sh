#!/bin/bash
# Interleaved before/after runs, same machine, same period.
cd /work/wt/tokenizer/engines/tokenizer
rm -f /tmp/tok/vshf_*.txt /tmp/tok/tok_*.txt
for i in 1 2 3 4 5 6; do
  for b in before after; do
    /tmp/tok/$b.test -test.run '^$' -test.bench 'TokenizeVsHF' -test.count 1 >> /tmp/tok/vshf_$b.txt 2>&1
  done
done
for i in 1 2 3 4 5 6; do
  for b in before after; do
    /tmp/tok/$b.test -test.run '^$' -test.bench 'Tokenize$/(qwen3|llama3_1|deepseek_v3|gptoss)/(prompts|licence|go|chinese|mixedscript)/cold' -test.benchmem -test.count 1 >> /tmp/tok/tok_$b.txt 2>&1
  done
done
echo done > /tmp/tok/run.done
