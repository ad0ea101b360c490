import type express from 'express';
import type { Request } from 'express';
import { WebSocket } from 'ws';
import type { Authenticator } from '../auth';
import type { ApiDeps } from '../deps';
import type { RouteTable } from '../http';
import { parseOrThrow } from '../http';
import { ApiError } from '../../contract/errors';
import { fromHostError } from '../../services/hosts/host-errors';
import type { SandboxServices } from '../../services/sandboxes/sandbox-services';
import { SandboxParams } from '../../contract/sandboxes';
import { closeWith } from '../ws';
import { PtySessionParams, CreatePtyBody, PtyView } from '../../contract/exec';

/*
 * Terminals (the OpenComputer client's `sandbox.pty`): POST starts a login shell on a pseudo-terminal
 * of the sandbox (kept by its host, see sandbox/host/pty.ts); the WebSocket at
 * /api/sandboxes/{id}/pty/{sessionID} relays keystrokes (and `{"type":"resize","cols","rows"}` text
 * frames) to it and its output (binary frames) back. Recorded in MongoDB (services/exec/pty.ts) so that
 * any API process can attach a client.
 */

/** POST /api/sandboxes/:id/pty. */
export function registerPtyRoutes(t: RouteTable, deps: ApiDeps, sandbox: SandboxServices): void {
  t.add({
    method: 'post',
    path: '/api/sandboxes/:id/pty',
    tag: 'exec',
    summary:
      'Start a login shell (bash -l, TERM=xterm-256color) on a pseudo-terminal of the sandbox; attach with the WebSocket at /api/sandboxes/{id}/pty/{sessionID}',
    params: SandboxParams,
    body: CreatePtyBody,
    responses: { 201: { description: 'The terminal', schema: PtyView } },
    errors: [409, 502, 503],
    handler: async ({ params, body, org, res }) => {
      const info = await sandbox.pty.start(org.id, params.id, body);
      res
        .status(201)
        .json({ sessionID: info.sessionID, sandboxID: params.id, cols: info.cols, rows: info.rows, running: info.running, startedAt: info.startedAt });
    },
  });
}

/** The WebSocket route (express-ws); no-op without WebSocket support (unit tests). */
export function registerPtySocket(app: express.Express, deps: ApiDeps, auth: Authenticator, sandbox: SandboxServices): void {
  const wsApp = app as express.Express & { ws?: (path: string, h: (ws: WebSocket, req: Request) => void) => void };
  if (typeof wsApp.ws !== 'function') return;
  const pty = sandbox.pty;
  wsApp.ws('/api/sandboxes/:id/pty/:sessionID', (client, req) => {
    // What the client types before the relay is up is kept, in order.
    const early: [Buffer, boolean][] = [];
    const keep = (data: Buffer, isBinary: boolean) => early.push([data, isBinary]);
    client.on('message', keep);
    void (async () => {
      try {
        const org = await auth.authenticate(req);
        const params = parseOrThrow(PtySessionParams, req.params, 'path');
        const host = await pty.hostOf(org.id, params.id, params.sessionID);
        const upstream = host.openPtySocket(params.id, params.sessionID);
        // Before the open: the host sends the recent output at once, possibly in the same read as its 101.
        upstream.on('message', (data: Buffer) => {
          if (client.readyState === WebSocket.OPEN) client.send(data, { binary: true });
        });
        await new Promise<void>((resolve, reject) => {
          upstream.once('open', () => resolve());
          upstream.once('unexpected-response', (_r, res) =>
            reject(
              new ApiError(
                res.statusCode === 404 ? 'not_found' : 'bad_gateway',
                res.statusCode === 404 ? `terminal ${params.sessionID} not found (it ended)` : `sandbox host answered ${res.statusCode}`,
              ),
            ),
          );
          upstream.once('error', reject);
        });
        client.off('message', keep);
        const send = (data: Buffer, isBinary: boolean) => {
          if (upstream.readyState === WebSocket.OPEN) upstream.send(data, { binary: isBinary });
        };
        for (const [d, b] of early) send(d, b);
        client.on('message', send);
        upstream.on('close', (code) => {
          if (client.readyState === WebSocket.OPEN) client.close(code === 1000 ? 1000 : 1011, code === 1000 ? 'exited' : 'terminal gone');
        });
        upstream.on('error', () => client.terminate());
        // A revoked key's terminal is closed as its requests are refused (api/auth.ts).
        const unwatch = auth.watch(req, org, () => closeWith(client, 1008, 'unauthorized', 'the API key was revoked'));
        const detach = () => {
          unwatch();
          upstream.close(1000, 'client left');
        };
        client.on('close', detach);
        client.on('error', detach);
        if (client.readyState !== WebSocket.OPEN) detach();
      } catch (err) {
        const e = err instanceof ApiError ? err : fromHostError(err, 'terminal');
        closeWith(client, e.status >= 500 ? 1011 : 1008, e.type, e.message);
      }
    })();
  });
}
