/**
 * The sandbox host's wire contract is declared once (sandbox/host-contract/wire.ts) and both sides
 * follow it: the host's app serves exactly the declared routes (a route added on the host only, or
 * declared and not served, fails here), HostClient calls each declared route and builds no path of
 * its own, and the declared paths and socket patterns agree with the host's parameters.
 */
import * as fs from 'node:fs';
import * as path from 'node:path';
import type express from 'express';
import pino from 'pino';
import { loadLimits } from '../../config/limits';
import type { SandboxProvider } from '../../sandbox/driver';
import { ExecManager } from '../../sandbox/host/exec';
import { PtyManager } from '../../sandbox/host/pty';
import { createApp } from '../../sandbox/host/server';
import { hostPath, hostPathPattern, hostRoutes, hostSockets } from '../../sandbox/host-contract/wire';

const ROOT = path.join(__dirname, '..', '..');
const logger = pino({ level: 'silent' });

/** `METHOD path` of every route the app registered (express 4 keeps them on its router's stack). */
function servedRoutes(app: express.Express): string[] {
  const stack = (app as unknown as { _router: { stack: { route?: { path: string; methods: Record<string, boolean> } }[] } })._router.stack;
  return stack.flatMap((layer) => (layer.route ? Object.keys(layer.route.methods).map((m) => `${m.toUpperCase()} ${layer.route!.path}`) : []));
}

const declared = Object.values(hostRoutes).map((r) => `${r.method} ${r.path}`);

describe('the host wire contract', () => {
  it('declares each method and path once', () => {
    expect(new Set(declared).size).toBe(declared.length);
  });

  it("is what the host's app serves, no route more or less", () => {
    const provider = { kind: 'fake', list: () => [], get: () => undefined, load: () => ({ sandboxes: 0, reservedMB: 0 }) } as unknown as SandboxProvider;
    const app = createApp({
      provider,
      token: 'unit-test-token-0123456789',
      logger,
      hostId: 'h',
      exec: new ExecManager(provider, logger),
      pty: new PtyManager(provider, logger),
      limits: loadLimits({}, { totalMemoryMB: 8000, cores: 4 }),
      maxSandboxes: 3,
    });
    const served = servedRoutes(app);
    expect(new Set(served).size).toBe(served.length);
    expect([...served].sort()).toEqual([...declared].sort());
  });

  it('is what HostClient calls: every route by its declaration, no path written by hand', () => {
    const client = fs.readFileSync(path.join(ROOT, 'sandbox/host-contract/client.ts'), 'utf8');
    const unused = Object.keys(hostRoutes).filter((name) => !client.includes(`hostRoutes.${name}`));
    expect(unused).toEqual([]);
    // A path literal ('/sandboxes…', `/layers…`) would be a route the declaration does not know.
    expect(client.match(/['`]\/(sandboxes|layers|metrics|exec-exits|healthz)\b/g)).toBeNull();
  });

  it('fills and matches its paths: parameters URI-encoded, one capture group each', () => {
    expect(hostPath(hostRoutes.getExec.path, { id: 'sb 1', sid: 'es-0123456789abcdef' })).toBe('/sandboxes/sb%201/exec/es-0123456789abcdef');
    expect(hostPath(hostRoutes.createSandbox.path)).toBe('/sandboxes');
    const exec = hostPathPattern(hostSockets.exec).exec(hostPath(hostSockets.exec, { id: 'sb-1', sid: 'es-1' }));
    expect(exec?.slice(1)).toEqual(['sb-1', 'es-1']);
    const tunnel = hostPathPattern(hostSockets.tunnel, { port: '\\d{1,5}' });
    expect(tunnel.exec(hostPath(hostSockets.tunnel, { id: 'sb-1', port: 8080 }))?.slice(1)).toEqual(['sb-1', '8080']);
    expect(tunnel.test('/sandboxes/sb-1/ports/http/tunnel')).toBe(false);
    expect(hostPathPattern(hostSockets.pty).test('/sandboxes/sb-1/pty/p-1/ws/more')).toBe(false);
  });

  it('validates requests with the declared schemas, messages naming the field', () => {
    const bad = hostRoutes.scaleSandbox.request.safeParse({ params: { id: 'sb-1' }, query: {}, body: { memoryMB: 1 } });
    expect(bad.success).toBe(false);
    expect(bad.error?.issues.map((i) => i.path.join('.'))).toEqual(['body.memoryMB']);
    const ok = hostRoutes.execResult.request.parse({ params: { id: 'sb-1', sid: 'es-1' }, query: { waitMs: '250' } });
    expect(ok.query.waitMs).toBe(250);
  });
});
