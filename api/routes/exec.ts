import { z } from 'zod';
import type { ApiDeps } from '../deps';
import type { RouteTable } from '../http';
import type { Authenticator } from '../auth';
import { wantsEventStream, writeExecEvents } from '../exec-events';
import '../http';
import { RESULT_WAIT_MS } from '../../services/exec/exec';
import type { SandboxServices } from '../../services/sandboxes/sandbox-services';
import { KillBody, SandboxParams } from '../../contract/sandboxes';
import { ExecSessionParams, CreateExecBody, RunExecBody, ExecSessionView, RunResultView, ExecResultView } from '../../contract/exec';

/*
 * Exec sessions (services/exec/exec.ts): a command started inside a sandbox, kept by the sandbox host,
 * recorded in MongoDB. The API relays every public WebSocket client to the host through a socket of
 * its own (./exec-socket.ts), so each public client is exactly one host client and
 * `attachedClients` (read from the host) counts them.
 *
 * Defaults: `timeout` none (the command runs until it exits or is killed); `maxRunAfterDisconnect`
 * none (the command outlives every client). `exec/run` waits at most `timeout` seconds, default 60.
 */

/** /api/sandboxes/:id/exec: start, list, read, kill, run (the OpenComputer API's shapes). */
export function registerExecRoutes(t: RouteTable, deps: ApiDeps, sandbox: SandboxServices, auth: Authenticator): void {
  const svc = sandbox.exec;
  svc.ensureIndexes();

  t.add({
    method: 'post',
    path: '/api/sandboxes/:id/exec',
    tag: 'exec',
    summary:
      'Start a command in the sandbox as an exec session; attach with the WebSocket at /api/sandboxes/{id}/exec/{sessionID}. ' +
      'With `Accept: text/event-stream` the answer is the session as server-sent events: `session`, then `stdout` and `stderr` ({"data": text}), then `exit` ({"exitCode"}) or `error`',
    params: SandboxParams,
    body: CreateExecBody,
    responses: { 201: { description: 'The running exec session', schema: ExecSessionView } },
    errors: [409, 429, 502, 503],
    handler: async ({ params, body, org, req, res }) => {
      if (!wantsEventStream(req)) {
        res.status(201).json(await svc.start(org.id, params.id, body));
        return;
      }
      const { session, pipe } = await svc.startStreamed(org.id, params.id, body);
      await writeExecEvents(req, res, auth, org, session, pipe);
    },
  });

  t.add({
    method: 'get',
    path: '/api/sandboxes/:id/exec',
    tag: 'exec',
    summary: "List the sandbox's exec sessions, newest first",
    params: SandboxParams,
    responses: { 200: { description: 'Exec sessions', schema: z.array(ExecSessionView) } },
    handler: async ({ params, org, res }) => {
      res.json(await svc.list(org.id, params.id));
    },
  });

  t.add({
    method: 'post',
    path: '/api/sandboxes/:id/exec/run',
    tag: 'exec',
    summary: 'Run a short command to completion and return its exit code and output',
    params: SandboxParams,
    body: RunExecBody,
    responses: { 200: { description: 'Exit code and output (a non-zero exit is a result)', schema: RunResultView } },
    errors: [409, 429, 502, 503],
    handler: async ({ params, body, org, res }) => {
      res.json(await svc.run(org.id, params.id, body));
    },
  });

  t.add({
    method: 'post',
    path: '/api/sandboxes/:id/exec/run-async',
    tag: 'exec',
    summary: 'Start a command to completion in the background; poll GET …/exec/{execId}/result for its exit code and output (the client’s exec.run)',
    params: SandboxParams,
    body: RunExecBody.omit({ stdin: true }),
    responses: { 201: { description: 'The handle to poll', schema: z.object({ execId: z.string(), sessionID: z.string() }) } },
    errors: [409, 429, 502, 503],
    handler: async ({ params, body, org, res }) => {
      const id = await svc.startAsync(org.id, params.id, { ...body, maxRunAfterDisconnect: undefined });
      res.status(201).json({ execId: id, sessionID: id });
    },
  });

  t.add({
    method: 'get',
    path: '/api/sandboxes/:id/exec/:sessionID/result',
    tag: 'exec',
    summary: `The exit code and output of an exec session; waits up to ${RESULT_WAIT_MS} ms for a running one to exit first`,
    params: ExecSessionParams,
    responses: { 200: { description: 'running: true until it exits', schema: ExecResultView } },
    errors: [502, 503],
    handler: async ({ params, org, res }) => {
      res.json(await svc.result(org.id, params.id, params.sessionID));
    },
  });

  t.add({
    method: 'get',
    path: '/api/sandboxes/:id/exec/:sessionID',
    tag: 'exec',
    summary: 'Get an exec session (running, exitCode and attachedClients as of now)',
    params: ExecSessionParams,
    responses: { 200: { description: 'The exec session', schema: ExecSessionView } },
    handler: async ({ params, org, res }) => {
      res.json(await svc.get(org.id, params.id, params.sessionID));
    },
  });

  t.add({
    method: 'post',
    path: '/api/sandboxes/:id/exec/:sessionID/kill',
    tag: 'exec',
    summary: "Signal an exec session's processes (default SIGKILL); answers once it exited (or after 2 s)",
    params: ExecSessionParams,
    body: KillBody,
    responses: { 200: { description: 'The exec session', schema: ExecSessionView } },
    handler: async ({ params, body, org, res }) => {
      res.json(await svc.kill(org.id, params.id, params.sessionID, body.signal));
    },
  });
}
