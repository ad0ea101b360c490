#!/usr/bin/env node
/*
 * An upstream for the sealed-secrets proxy's attack tests (test/integration/security/sealed-proxy.test.ts):
 * HTTPS on --port with --cert/--cert-key. It logs every request it parses, as it parsed it (method,
 * target, raw headers, body), one JSON line each to --log, so a test sees exactly what the proxy
 * forwarded (a second request smuggled in a body shows up as a line of its own). Every answer echoes
 * the request, as some APIs do in errors and debug endpoints: the raw headers in the body and the
 * x-api-key header in the `x-echo` answer header. `?gzip` answers gzip-compressed (whatever the
 * request accepts); `?drip` writes the body a few bytes at a time.
 *
 *   node echo-upstream.js --host ADDR --port 443 --log FILE --cert PEM --cert-key PEM
 * Prints `{"listening":PORT}` once it accepts connections. Node's own modules only.
 */
'use strict';
const https = require('node:https');
const fs = require('node:fs');
const zlib = require('node:zlib');

const o = {};
for (let i = 2; i < process.argv.length; i += 2) o[process.argv[i].replace(/^--/, '')] = process.argv[i + 1];

const server = https.createServer({ cert: fs.readFileSync(o.cert), key: fs.readFileSync(o['cert-key']) }, (req, res) => {
  const chunks = [];
  req.on('data', (c) => chunks.push(c));
  req.on('end', () => {
    const body = Buffer.concat(chunks).toString('latin1');
    const entry = { method: req.method, url: req.url, rawHeaders: req.rawHeaders, body };
    fs.appendFileSync(o.log, JSON.stringify(entry) + '\n');
    const echo = Buffer.from(JSON.stringify(entry));
    const headers = { 'content-type': 'application/json', 'x-echo': String(req.headers['x-api-key'] ?? '') };
    if ((req.url || '').includes('gzip')) {
      const z = zlib.gzipSync(echo);
      res.writeHead(200, { ...headers, 'content-encoding': 'gzip', 'content-length': z.length });
      return res.end(z);
    }
    if ((req.url || '').includes('drip')) {
      res.writeHead(200, headers);
      let at = 0;
      const step = () => {
        if (at >= echo.length) return res.end();
        res.write(echo.subarray(at, at + 5));
        at += 5;
        setImmediate(step);
      };
      return step();
    }
    res.writeHead(200, { ...headers, 'content-length': echo.length });
    res.end(echo);
  });
});
server.listen(Number(o.port), o.host, () => console.log(JSON.stringify({ listening: Number(o.port) })));
