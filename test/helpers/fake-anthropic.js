#!/usr/bin/env node
/*
 * A fake Anthropic Messages API for tests: POST /v1/messages answers with server-sent events the way
 * the real API streams (message_start, content_block_start / delta / stop, message_delta,
 * message_stop), or with one JSON message when the request does not ask for a stream. Node's own
 * modules only, so that it runs anywhere a `node` is: on a test host, or inside a sandbox.
 *
 *   node fake-anthropic.js [--port N] [--host ADDR] [--log FILE] [--key KEY] [--cert PEM --cert-key PEM]
 *
 * With --cert and --cert-key it speaks HTTPS with that certificate (sealed secrets' test: a test CA's leaf).
 *
 * With --key, a request to /v1/… whose x-api-key header is not KEY gets 401 (authentication_error), as the
 * real API answers a wrong key; the log then records `keyOk: false`.
 * Prints `{"listening":PORT}` on stdout once it accepts connections (port 0, the default, picks a
 * free one). With --log, every request body is appended to FILE as one JSON line.
 *
 * The answer depends on the request only (the last user message and the conversation before it):
 *   - the last user message carries tool results → text "tool result (ok|error): <their text>"
 *   - its text contains [tool NAME {json input}] → a tool_use block calling NAME with that input
 *   - its text contains [slow]                   → a long text streamed a word every 100 ms (about a minute)
 *   - otherwise → "You said: <text>. Earlier: <the conversation's earlier user texts, joined by ' | '>"
 * Other paths answer 404 with the API's error shape; POST /v1/messages/count_tokens answers a count.
 */
'use strict';
const http = require('node:http');
const fs = require('node:fs');

function args(argv) {
  const o = { port: 0, host: '127.0.0.1', log: undefined, key: undefined, cert: undefined, certKey: undefined };
  for (let i = 0; i < argv.length; i++) {
    if (argv[i] === '--port') o.port = Number(argv[++i]);
    else if (argv[i] === '--host') o.host = argv[++i];
    else if (argv[i] === '--log') o.log = argv[++i];
    else if (argv[i] === '--key') o.key = argv[++i];
    else if (argv[i] === '--cert') o.cert = argv[++i];
    else if (argv[i] === '--cert-key') o.certKey = argv[++i];
  }
  return o;
}

/** The text of a message's content, without the CLI's <system-reminder> blocks. */
function textOf(content) {
  const parts = typeof content === 'string' ? [content] : (content || []).filter((b) => b && b.type === 'text').map((b) => b.text);
  return parts
    .map((t) =>
      String(t)
        .replace(/<system-reminder>[\s\S]*?<\/system-reminder>/g, '')
        .trim(),
    )
    .filter(Boolean)
    .join(' ');
}

function toolResults(content) {
  return Array.isArray(content) ? content.filter((b) => b && b.type === 'tool_result') : [];
}

function resultText(block) {
  const c = block.content;
  if (typeof c === 'string') return c;
  return (c || []).map((x) => (x && x.type === 'text' ? x.text : '')).join('');
}

/** What to answer: a list of content blocks, the stop reason, and the delay between text chunks. */
function plan(body) {
  const messages = Array.isArray(body.messages) ? body.messages : [];
  const users = messages.filter((m) => m && m.role === 'user');
  const last = users[users.length - 1];
  const results = last ? toolResults(last.content) : [];
  if (results.length > 0) {
    const words = results.map((r) => `${r.is_error ? 'error' : 'ok'}: ${resultText(r)}`).join(' ; ');
    return { blocks: [{ type: 'text', text: `tool result (${words})` }], stop: 'end_turn', delayMs: 0 };
  }
  const text = last ? textOf(last.content) : '';
  const tool = /\[tool (\w+) (\{.*?\})\]/.exec(text);
  if (tool) {
    let input = {};
    try {
      input = JSON.parse(tool[2]);
    } catch {
      /* an empty input then */
    }
    return {
      blocks: [
        { type: 'text', text: `Calling ${tool[1]}.` },
        { type: 'tool_use', name: tool[1], input },
      ],
      stop: 'tool_use',
      delayMs: 0,
    };
  }
  if (text.includes('[slow]')) {
    const words = Array.from({ length: 600 }, (_, i) => `word${i} `);
    return { blocks: [{ type: 'text', text: words.join(''), chunks: words }], stop: 'end_turn', delayMs: 100 };
  }
  const earlier = users
    .slice(0, -1)
    .filter((m) => toolResults(m.content).length === 0)
    .map((m) => textOf(m.content))
    .filter(Boolean);
  return { blocks: [{ type: 'text', text: `You said: ${text}. Earlier: ${earlier.join(' | ') || '(nothing)'}` }], stop: 'end_turn', delayMs: 0 };
}

let seq = 0;
function ids() {
  seq += 1;
  return { msg: `msg_fake${String(seq).padStart(6, '0')}`, tool: `toolu_fake${String(seq).padStart(6, '0')}` };
}

function usage(body) {
  return { input_tokens: Math.max(1, Math.ceil(JSON.stringify(body.messages || []).length / 4)), output_tokens: 0 };
}

function fullMessage(body, p) {
  const id = ids();
  const content = p.blocks.map((b) => (b.type === 'text' ? { type: 'text', text: b.text } : { type: 'tool_use', id: id.tool, name: b.name, input: b.input }));
  const u = usage(body);
  u.output_tokens = 10;
  return { id: id.msg, type: 'message', role: 'assistant', model: body.model || 'fake', content, stop_reason: p.stop, stop_sequence: null, usage: u };
}

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

async function stream(req, res, body, p) {
  const id = ids();
  res.writeHead(200, { 'content-type': 'text/event-stream', 'cache-control': 'no-cache', 'request-id': `req_${id.msg}` });
  let gone = false;
  res.on('close', () => (gone = true));
  const send = (type, data) => {
    if (!gone) res.write(`event: ${type}\ndata: ${JSON.stringify({ type, ...data })}\n\n`);
  };
  send('message_start', {
    message: {
      id: id.msg,
      type: 'message',
      role: 'assistant',
      model: body.model || 'fake',
      content: [],
      stop_reason: null,
      stop_sequence: null,
      usage: usage(body),
    },
  });
  send('ping', {});
  for (let i = 0; i < p.blocks.length && !gone; i++) {
    const b = p.blocks[i];
    if (b.type === 'text') {
      send('content_block_start', { index: i, content_block: { type: 'text', text: '' } });
      for (const chunk of b.chunks || [b.text]) {
        if (gone) break;
        send('content_block_delta', { index: i, delta: { type: 'text_delta', text: chunk } });
        if (p.delayMs) await sleep(p.delayMs);
      }
    } else {
      send('content_block_start', { index: i, content_block: { type: 'tool_use', id: id.tool, name: b.name, input: {} } });
      send('content_block_delta', { index: i, delta: { type: 'input_json_delta', partial_json: JSON.stringify(b.input) } });
    }
    send('content_block_stop', { index: i });
  }
  send('message_delta', { delta: { stop_reason: p.stop, stop_sequence: null }, usage: { output_tokens: 10 } });
  send('message_stop', {});
  if (!gone) res.end();
}

function fail(res, status, type, message) {
  res.writeHead(status, { 'content-type': 'application/json' });
  res.end(JSON.stringify({ type: 'error', error: { type, message } }));
}

function main() {
  const o = args(process.argv.slice(2));
  const tlsOpts = o.cert ? { cert: fs.readFileSync(o.cert), key: fs.readFileSync(o.certKey) } : null;
  const server = (tlsOpts ? (h) => require('node:https').createServer(tlsOpts, h) : (h) => http.createServer(h))((req, res) => {
    const chunks = [];
    req.on('data', (c) => chunks.push(c));
    req.on('end', () => {
      const url = new URL(req.url || '/', 'http://fake');
      let body;
      try {
        body = chunks.length ? JSON.parse(Buffer.concat(chunks).toString('utf8')) : {};
      } catch {
        return fail(res, 400, 'invalid_request_error', 'body is not JSON');
      }
      // The key is checked on the API's routes (/v1/…); Claude Code's connectivity probe (HEAD /api/hello) carries none.
      const keyOk = !o.key || !url.pathname.startsWith('/v1/') || req.headers['x-api-key'] === o.key;
      const auth = req.headers['x-api-key'] ? 'x-api-key' : req.headers.authorization ? 'authorization' : 'none';
      const host = req.headers.host;
      if (o.log) fs.appendFileSync(o.log, `${JSON.stringify({ method: req.method, path: url.pathname, keyOk, auth, host, headers: req.headers, body })}\n`);
      if (!keyOk) return fail(res, 401, 'authentication_error', 'invalid x-api-key');
      if (req.method === 'POST' && url.pathname === '/v1/messages/count_tokens') {
        res.writeHead(200, { 'content-type': 'application/json' });
        return res.end(JSON.stringify({ input_tokens: usage(body).input_tokens }));
      }
      if (req.method !== 'POST' || url.pathname !== '/v1/messages') return fail(res, 404, 'not_found_error', `no route ${req.method} ${url.pathname}`);
      const p = plan(body);
      if (!body.stream) {
        res.writeHead(200, { 'content-type': 'application/json' });
        return res.end(JSON.stringify(fullMessage(body, p)));
      }
      stream(req, res, body, p).catch(() => res.destroy());
    });
  });
  server.listen(o.port, o.host, () => {
    process.stdout.write(`${JSON.stringify({ listening: server.address().port })}\n`);
  });
  for (const sig of ['SIGTERM', 'SIGINT']) process.on(sig, () => server.close(() => process.exit(0)));
}

if (require.main === module) main();
module.exports = { plan, textOf };
