import http from 'node:http';
import { createApp } from './app';
import type { ApiDeps } from './deps';

/**
 * The API's HTTP server: the Express app (with WebSocket routes) on one server.
 * api/main.ts listens on it; tests may too.
 */
export function createApiServer(deps: ApiDeps): { server: http.Server; openapi: object } {
  const server = http.createServer();
  const { app, openapi } = createApp(deps, { server });
  server.on('request', app);
  server.keepAliveTimeout = 65_000;
  return { server, openapi };
}
