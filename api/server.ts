import http from 'node:http';
import { createApp } from './app';
import { answerClientErrors } from './client-errors';
import type { ApiDeps } from './deps';
import { PreviewProxy } from './preview-proxy';
import { createServices } from '../services';
import { followExecExits } from '../services/exec/exec-exits';

/**
 * The API's HTTP server: the Express app (with WebSocket routes) and the preview proxy on one server.
 * A request (or WebSocket upgrade) whose Host names a preview (`<sandbox id>-p<port>.<domain>`) goes to
 * the proxy; everything else to the app, whose WebSocket routes (express-ws) keep their own upgrade
 * handling. With PREVIEW_PORT set, `previewServer` serves previews only, on that port.
 * api/main.ts listens on them; tests may too.
 */
export function createApiServer(deps: ApiDeps): { server: http.Server; previewServer?: http.Server; openapi: object } {
  const server = http.createServer();
  const services = createServices(deps);
  const { app, openapi, metrics } = createApp(deps, { server, services });
  const proxy = new PreviewProxy(services.sandbox.previews);

  server.on('request', (req: http.IncomingMessage, res: http.ServerResponse) => {
    const hostname = proxy.match(req.headers.host);
    if (hostname) {
      metrics.proxyRequests.inc({ kind: 'http' });
      void proxy.handleRequest(req, res, hostname);
    } else app(req, res);
  });
  // express-ws registered its upgrade listener when the app was built: route around it for previews.
  const appUpgrades = server.listeners('upgrade') as ((...args: unknown[]) => void)[];
  server.removeAllListeners('upgrade');
  server.on('upgrade', (req: http.IncomingMessage, socket, head: Buffer) => {
    const hostname = proxy.match(req.headers.host);
    if (hostname) {
      metrics.proxyRequests.inc({ kind: 'websocket' });
      void proxy.handleUpgrade(req, socket, head, hostname);
    } else for (const l of appUpgrades) l.call(server, req, socket, head);
  });
  server.keepAliveTimeout = 65_000;
  answerClientErrors(server);
  server.on('close', () => proxy.close());
  // Exec sessions' exits recorded as their hosts report them (services/exec/exec-exits), while this serves.
  let exits: { stop(): void } | null = null;
  server.on('listening', () => {
    exits ??= followExecExits(deps, services.sandbox.live);
  });
  server.on('close', () => {
    exits?.stop();
    exits = null;
  });

  let previewServer: http.Server | undefined;
  if (deps.cfg.PREVIEW_PORT) {
    previewServer = http.createServer((req, res) => void proxy.handleRequest(req, res, proxy.match(req.headers.host) ?? ''));
    previewServer.on(
      'upgrade',
      (req: http.IncomingMessage, socket, head: Buffer) => void proxy.handleUpgrade(req, socket, head, proxy.match(req.headers.host) ?? ''),
    );
    previewServer.keepAliveTimeout = 65_000;
    answerClientErrors(previewServer);
  }
  return { server, previewServer, openapi };
}
