#!/bin/bash
# Interleaved before/after runs, same machine, same period; run from the
# repository root with /tmp/tok8/{before,after}.test built (README.md).
cd "$(dirname "$0")/../../../engines/tokenizer"
out=/tmp/tok8
rm -f $out/vshf_*.txt $out/tok_*.txt $out/run.done
uptime > $out/load.txt
for i in 1 2 3; do
  for b in before after; do
    $out/$b.test -test.run '^$' -test.bench 'TokenizeVsHF' -test.count 1 >> $out/vshf_$b.txt 2>&1
    uptime >> $out/load.txt
  done
done
for i in 1 2 3; do
  for b in before after; do
    $out/$b.test -test.run '^$' -test.bench 'Tokenize$/(qwen3|llama3_1|deepseek_v3|gptoss)/(prompts|licence|go|chinese|mixedscript)/cold' -test.benchmem -test.count 1 >> $out/tok_$b.txt 2>&1
    uptime >> $out/load.txt
  done
done
echo done > $out/run.done
