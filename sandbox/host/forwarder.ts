/**
 * The port forwarder: a tiny process the sandbox host starts inside one sandbox's network namespace
 * (with `nsenter -n`, so it keeps the host's filesystem). For each forwarded port it listens on a Unix
 * socket in the host's data directory (invisible inside the sandbox) and pipes every connection to
 * 127.0.0.1:<port> inside the sandbox. Unix sockets are named in the filesystem, not in a network
 * namespace, which is how the host's side reaches a sandbox that has only loopback.
 *
 * Control protocol, one JSON object per line: stdin `{ seq, op: 'open', port, path }` or
 * `{ seq, op: 'close', port }`; stdout `{ seq, ok: true }` or `{ seq, ok: false, error }`.
 * When stdin ends (the host went away) every socket is removed and the process exits.
 * Only ports that were opened are reachable: there is no other listener.
 */
import * as fs from 'node:fs';
import * as net from 'node:net';
import * as readline from 'node:readline';

/** A control message from the host. */
export type ForwarderCommand = { seq: number; op: 'open'; port: number; path: string } | { seq: number; op: 'close'; port: number };

/** The answer to one command. */
export type ForwarderReply = { seq: number; ok: true } | { seq: number; ok: false; error: string };

const listeners = new Map<number, { server: net.Server; path: string; conns: Set<net.Socket> }>();

function reply(r: ForwarderReply): void {
  process.stdout.write(`${JSON.stringify(r)}\n`);
}

/** Pipes one accepted Unix connection to the sandbox port, both directions, half-closes included. */
function bridge(client: net.Socket, port: number): void {
  const upstream = net.connect({ host: '127.0.0.1', port, allowHalfOpen: true });
  upstream.setNoDelay(true);
  const destroyBoth = () => {
    client.destroy();
    upstream.destroy();
  };
  client.on('error', destroyBoth);
  upstream.on('error', destroyBoth);
  client.on('close', () => upstream.destroy());
  upstream.on('close', () => client.destroy());
  client.pipe(upstream);
  upstream.pipe(client);
}

async function open(port: number, path: string): Promise<void> {
  if (listeners.has(port)) return;
  fs.rmSync(path, { force: true });
  const conns = new Set<net.Socket>();
  const server = net.createServer({ allowHalfOpen: true }, (c) => {
    conns.add(c);
    c.on('close', () => conns.delete(c));
    bridge(c, port);
  });
  await new Promise<void>((resolve, reject) => {
    server.once('error', reject);
    server.listen(path, () => resolve());
  });
  fs.chmodSync(path, 0o600);
  listeners.set(port, { server, path, conns });
}

function close(port: number): void {
  const l = listeners.get(port);
  if (!l) return;
  listeners.delete(port);
  l.server.close();
  // Closing a port also cuts the connections already open through it (kept-alive HTTP, WebSockets).
  for (const c of l.conns) c.destroy();
  fs.rmSync(l.path, { force: true });
}

function closeAll(): void {
  for (const port of [...listeners.keys()]) close(port);
}

function main(): void {
  const rl = readline.createInterface({ input: process.stdin });
  rl.on('line', (line) => {
    let cmd: ForwarderCommand;
    try {
      cmd = JSON.parse(line) as ForwarderCommand;
    } catch {
      return;
    }
    const done = (p: Promise<void>) =>
      p.then(
        () => reply({ seq: cmd.seq, ok: true }),
        (err: Error) => reply({ seq: cmd.seq, ok: false, error: err.message }),
      );
    if (cmd.op === 'open') void done(open(cmd.port, cmd.path));
    else if (cmd.op === 'close') void done(Promise.resolve(close(cmd.port)));
  });
  rl.on('close', () => {
    closeAll();
    process.exit(0);
  });
  for (const sig of ['SIGTERM', 'SIGINT'] as const) {
    process.on(sig, () => {
      closeAll();
      process.exit(0);
    });
  }
}

if (require.main === module) main();
