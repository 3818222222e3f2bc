// Talks to enginesim (vLLM and SGLang flavours) through the official OpenAI
// client: a tool-calling conversation with tool_choice auto, required and a
// named function, streamed and not. Starts the simulator on 127.0.0.1 and
// always stops it.
import { test, before, after } from 'node:test';
import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { createServer } from 'node:net';
import path from 'node:path';
import OpenAI from 'openai';

const bin = path.resolve(import.meta.dirname, '../../bin/enginesim');
const model = 'Qwen/Qwen3-32B';
const tools = [{
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'Current weather in a city',
    parameters: { type: 'object', properties: { city: { type: 'string' }, unit: { type: 'string', enum: ['c', 'f'] } }, required: ['city', 'unit'] },
  },
}, {
  type: 'function',
  function: { name: 'get_time', parameters: { type: 'object', properties: { tz: { type: 'string' } }, required: ['tz'] } },
}];

function freePort() {
  return new Promise((resolve, reject) => {
    const srv = createServer();
    srv.listen(0, '127.0.0.1', () => { const { port } = srv.address(); srv.close(() => resolve(port)); });
    srv.on('error', reject);
  });
}

async function startSim(flavour) {
  const [http, zmq] = [await freePort(), await freePort()];
  const proc = spawn(bin, ['-engine', flavour, '-listen', `127.0.0.1:${http}`, '-kv-events-endpoint', `tcp://127.0.0.1:${zmq}`,
    '-time-scale', '100', '-log-level', 'warn'], { stdio: ['ignore', 'inherit', 'inherit'] });
  const base = `http://127.0.0.1:${http}`;
  for (let i = 0; i < 200; i++) {
    try { if ((await fetch(`${base}/health`)).ok) break; } catch { /* not up yet */ }
    await new Promise((r) => setTimeout(r, 25));
  }
  return { proc, client: new OpenAI({ baseURL: `${base}/v1`, apiKey: 'unused', maxRetries: 0 }) };
}

async function streamed(client, body) {
  const stream = await client.chat.completions.create({ ...body, stream: true, stream_options: { include_usage: true } });
  const calls = [];
  let content = '', finish = null, usage = null;
  for await (const chunk of stream) {
    if (chunk.usage) usage = chunk.usage;
    for (const choice of chunk.choices) {
      content += choice.delta.content ?? '';
      for (const d of choice.delta.tool_calls ?? []) {
        if (d.id) {
          assert.equal(d.type, 'function');
          assert.ok(d.function?.name, 'the first delta names the function');
          calls[d.index] = { id: d.id, name: d.function.name, arguments: d.function.arguments ?? '' };
        } else {
          assert.ok(calls[d.index], 'argument fragments follow the head delta');
          calls[d.index].arguments += d.function?.arguments ?? '';
        }
      }
      if (choice.finish_reason) finish = choice.finish_reason;
    }
  }
  return { calls, content, finish, usage };
}

for (const flavour of ['vllm', 'sglang']) {
  let sim;
  before(async () => { sim = await startSim(flavour); });
  after(() => { sim.proc.kill('SIGTERM'); });

  test(`${flavour}: models and plain chat`, async () => {
    const models = await sim.client.models.list();
    assert.deepEqual(models.data.map((m) => m.id), [model]);
    const r = await sim.client.chat.completions.create({ model, messages: [{ role: 'user', content: 'Say hello.' }], max_tokens: 8 });
    assert.equal(r.model, model);
    assert.ok(r.choices[0].message.content.length > 0);
    assert.ok(r.usage.completion_tokens > 0 && r.usage.completion_tokens <= 8, 'max_tokens is honoured');
  });

  const cases = [
    { name: 'auto', tool_choice: 'auto', finish: 'tool_calls' },
    { name: 'required', tool_choice: 'required', finish: 'tool_calls' },
    { name: 'named', tool_choice: { type: 'function', function: { name: 'get_time' } }, finish: 'stop', fn: 'get_time' },
  ];
  for (const c of cases) {
    test(`${flavour}: tool_choice ${c.name}, streamed and not, then the conversation continues`, async () => {
      const messages = [{ role: 'user', content: 'What is the weather in Oslo, and the time?' }];
      const body = { model, messages, tools, tool_choice: c.tool_choice };
      const r = await sim.client.chat.completions.create(body);
      const call = r.choices[0].message.tool_calls?.[0];
      assert.ok(call, 'a tool call is produced');
      assert.equal(r.choices[0].finish_reason, c.finish);
      if (c.fn) assert.equal(call.function.name, c.fn);
      const args = JSON.parse(call.function.arguments);
      assert.equal(typeof args, 'object');

      const s = await streamed(sim.client, body);
      assert.equal(s.calls.length, 1);
      assert.equal(s.finish, c.finish);
      assert.equal(s.calls[0].name, call.function.name);
      assert.deepEqual(JSON.parse(s.calls[0].arguments), args, 'streamed fragments assemble the same arguments');
      assert.ok(s.usage.prompt_tokens > 0);

      // The client runs the tool and sends the result back: the model answers in text.
      const followUp = [...messages, r.choices[0].message, { role: 'tool', tool_call_id: call.id, content: '{"ok": true}' }];
      const answer = await sim.client.chat.completions.create({ model, messages: followUp, tools, max_tokens: 12 });
      assert.equal(answer.choices[0].message.tool_calls?.length ?? 0, 0);
      assert.ok(answer.choices[0].message.content.length > 0);
      assert.ok(answer.usage.prompt_tokens_details.cached_tokens > 0, 'the earlier turn is a prefix-cache hit');
    });
  }

  test(`${flavour}: errors come back as OpenAI errors`, async () => {
    await assert.rejects(sim.client.chat.completions.create({ model: 'missing', messages: [{ role: 'user', content: 'x' }] }),
      (err) => err.status === 404 && /does not exist/.test(err.message));
  });
}
