import type { Socket } from 'node:net';
import type express from 'express';
import type { Request } from 'express';
import { WebSocket } from 'ws';
import type { Authenticator } from '../auth';
import type { ApiDeps } from '../deps';
import { parseOrThrow } from '../http';
import { ApiError, notFound } from '../../contract/errors';
import type { Logger } from '../../lib/logger';
import type { HostClient } from '../../sandbox';
import { FRAME_EXIT, FRAME_STDIN, writeRawFrame } from '../../sandbox';
import type { ExecLive } from '../../services/exec/exec-live';
import { fromHostError } from '../../services/hosts/host-errors';
import type { SandboxServices } from '../../services/sandboxes/sandbox-services';
import { closeWith, pauseSocket, resumeSocket } from '../ws';
import { ExecSocketParams } from '../../contract/exec';
import { trace } from '../../lib/trace';

/* ------------------------------------------------------------------------------------------------
 * WebSocket attach: /api/sandboxes/:id/exec/:sessionID (es-… or an agent session's as-…).
 * The key comes in X-API-Key or ?api_key=. A refused socket gets one text frame
 * {"error":{type,message}} and is closed with 1008 (policy violation); a bad client frame closes
 * it with 1003; a host failure with 1011. A session with EXEC_ATTACHES_PER_SESSION clients refuses
 * another with type rate_limited (429). A client that reads nothing is closed with 1008 and a reason
 * once more than EXEC_WS_BACKLOG_MAX_BYTES wait for it, or once it has held its stream paused
 * (backpressure) for EXEC_WS_STALL_SECONDS.
 * --------------------------------------------------------------------------------------------- */

/** Bytes queued toward one side above which the relay stops reading the other side (until that side drains). */
const RELAY_HIGH = 2 * 1024 * 1024;

type EarlyFrame = [string | Buffer | ArrayBuffer | Buffer[], boolean | undefined];

/**
 * How long the first output frames wait, at most, for a client that answers no ping (see ReadGate),
 * counted from when the relay starts reading the client.
 */
const FIRST_FRAME_HOLD_MAX_MS = 500;

/**
 * Opens once the client has shown that it handles what it reads: the API pings it as soon as the
 * connection is upgraded, and the gate opens on its pong (or on any frame it sends first).
 *
 * Why: the published OpenComputer client sets its message handler only after awaiting its `open`
 * event. Frames that reach it in the same read as the 101 answer are dispatched before that (its
 * WebSocket parses the rest of that read on the next tick, ahead of the awaiting code) and lost:
 * the scrollback, its end marker, a finished session's exit. A client answers a ping while it
 * parses the read that carried it, which comes after its `open` handlers and the microtasks
 * they queued have run; whatever is sent after its pong arrives in a later read, when its handler
 * is set. A client that listens at once loses nothing: its pong comes back within a round trip,
 * while the API is still checking the key and opening the host's stream. A client that answers no
 * ping gets its frames FIRST_FRAME_HOLD_MAX_MS after the relay starts reading it.
 */
class ReadGate {
  open = false;
  private waiting: (() => void)[] = [];
  private timer: NodeJS.Timeout | undefined;

  constructor(private readonly ws: WebSocket) {
    ws.once('pong', this.release);
    ws.once('message', this.release);
    ws.once('close', this.release);
    if (ws.readyState === WebSocket.OPEN) ws.ping(undefined, undefined, () => undefined);
    else this.release();
  }
  /** Starts the fallback timer: reading the client has begun, so its pong can arrive. */
  arm(): void {
    if (!this.open && !this.timer) this.timer = setTimeout(this.release, FIRST_FRAME_HOLD_MAX_MS);
  }
  /** Runs `fn` once the gate is open (now, if it is). */
  whenOpen(fn: () => void): void {
    if (this.open) fn();
    else this.waiting.push(fn);
  }
  readonly release = (): void => {
    if (this.open) return;
    this.open = true;
    clearTimeout(this.timer);
    this.ws.off('pong', this.release);
    this.ws.off('message', this.release);
    this.ws.off('close', this.release);
    for (const fn of this.waiting.splice(0)) fn();
  };
}

/**
 * Relays a public client and the host's exec stream for the same session, with backpressure both
 * ways: reading one side pauses while the other side has more than RELAY_HIGH bytes queued.
 *
 * Host → client: the host's frames (unmasked server frames, no extension) are valid as they are
 * on the public socket, so each is written on it unchanged, as views of what was read from the
 * host (no decoding, re-encoding or copy); only the exit frame's code is read, to record it. The
 * frames go on the connection the client's WebSocket was upgraded on (`clientSocket`), whole frames
 * at a time, so they never interleave with what the ws library writes there (pongs, close frames).
 * Client → host: stdin frames are checked (binary, 0x00 first), then sent on, masked.
 *
 * A client that does not read is dropped (close 1008 with a reason): when more than
 * EXEC_WS_BACKLOG_MAX_BYTES are queued toward it, or when the host stream has stayed paused for it
 * EXEC_WS_STALL_SECONDS (else it would keep the command paused and its buffers held for ever).
 */
function relay(
  deps: ApiDeps,
  live: ExecLive,
  client: WebSocket,
  clientSocket: Socket,
  host: HostClient,
  target: { sandboxId: string; execId: string },
  sessionID: string,
  kind: 'exec' | 'agent',
  early: EarlyFrame[],
  log: Logger,
  touch: () => void,
  gate: ReadGate,
): void {
  const pending: Buffer[] = [];
  const held: Parameters<typeof writeRawFrame>[1][] = [];
  let afterHeld: (() => void) | undefined;
  let opened = false;
  let clientPausedByUs = false;
  let upstreamPausedByUs = false;
  let heldBytes = 0;
  let stallTimer: NodeJS.Timeout | undefined;
  let dropped = false;
  const backlogMax = deps.cfg.EXEC_WS_BACKLOG_MAX_BYTES;
  const stallMs = deps.cfg.EXEC_WS_STALL_SECONDS * 1000;

  /** Closes a client that does not read (1008 and why) and leaves the host's stream. */
  const drop = (why: string) => {
    if (dropped) return;
    dropped = true;
    clearTimeout(stallTimer);
    log.info({ sessionID, unsent: clientSocket.writableLength }, `exec relay: client dropped: ${why}`);
    upstream.close(1000, 'client left');
    if (client.readyState === WebSocket.OPEN) client.close(1008, `client not reading: ${why}`.slice(0, 120));
    // Its close frame waits behind what it did not read; ws drops the connection if it never answers.
  };
  /** Stops reading the host while the client has too much queued; drops the client if that lasts. */
  const pauseUpstreamFor = () => {
    if (upstreamPausedByUs) return;
    upstreamPausedByUs = true;
    upstream.pause();
    clientSocket.once('drain', resumeUpstream);
    stallTimer = setTimeout(() => drop(`its stream stayed paused ${deps.cfg.EXEC_WS_STALL_SECONDS} s (EXEC_WS_STALL_SECONDS)`), stallMs);
  };

  const resumeClient = () => {
    if (!clientPausedByUs) return;
    clientPausedByUs = false;
    resumeSocket(client);
  };
  const resumeUpstream = () => {
    clearTimeout(stallTimer);
    if (!upstreamPausedByUs || dropped) return;
    upstreamPausedByUs = false;
    upstream.resume();
  };

  trace(target.sandboxId, 'api:ws-relay');
  const upstream = host.openExecStream(target.sandboxId, target.execId, {
    onOpen: () => {
      trace(target.sandboxId, 'api:ws-upstream-open');
      opened = true;
      for (const b of pending.splice(0)) upstream.send(b);
      // The client may have been paused while its frames waited for the host.
      if (!clientPausedByUs) watchUpstreamQueue();
      else if (upstream.bufferedAmount > RELAY_HIGH) upstream.onDrain(resumeClient);
      else resumeClient();
    },
    onFrame: (f) => {
      if (client.readyState !== WebSocket.OPEN) return;
      trace(target.sandboxId, 'api:ws-host-frame');
      touch();
      if (f.first === FRAME_EXIT && f.payload && f.payload.length >= 5) void live.recordExit(kind, sessionID, f.payload.readInt32BE(1), new Date());
      // Held until the client reads (see ReadGate), in order.
      if (held.length || !gate.open) {
        held.push(f.raw);
        heldBytes += f.length;
        // Do not read the host faster than frames can be held.
        if (heldBytes > RELAY_HIGH && !upstreamPausedByUs) {
          upstreamPausedByUs = true;
          upstream.pause();
        }
        if (held.length === 1) {
          gate.whenOpen(() => {
            trace(target.sandboxId, 'api:ws-gate-open');
            for (const raw of held.splice(0)) if (client.readyState === WebSocket.OPEN) writeRawFrame(clientSocket, raw);
            heldBytes = 0;
            if (upstreamPausedByUs && !dropped) {
              upstreamPausedByUs = false;
              if (clientSocket.writableLength > RELAY_HIGH) pauseUpstreamFor();
              else upstream.resume();
            }
            // A close that came while frames were held goes after them.
            afterHeld?.();
            afterHeld = undefined;
          });
        }
        return;
      }
      writeRawFrame(clientSocket, f.raw);
      if (clientSocket.writableLength > backlogMax) drop(`more than ${backlogMax} bytes unsent (EXEC_WS_BACKLOG_MAX_BYTES)`);
      else if (clientSocket.writableLength > RELAY_HIGH) pauseUpstreamFor();
    },
    onClose: (code, reason) => {
      if (held.length) {
        afterHeld = () => upstreamClosed(code, reason);
        return;
      }
      upstreamClosed(code, reason);
    },
    onError: (err) => {
      log.warn({ err: err.message, sessionID }, 'exec relay: host socket failed');
      if (client.readyState !== WebSocket.OPEN) return;
      if (err.status === 404) closeWith(client, 1011, 'not_found', 'the exec session is no longer on its sandbox host');
      else if (err.status === 429) {
        closeWith(
          client,
          1008,
          'rate_limited',
          'the exec session has as many attached clients as its host allows (EXEC_ATTACHES_PER_SESSION); detach one first',
        );
      } else closeWith(client, 1011, 'bad_gateway', 'the sandbox host is unreachable');
    },
  });
  /** The host's end closed: the client's closes the same way (after any held frames). */
  function upstreamClosed(code: number, reason: string): void {
    if (client.readyState !== WebSocket.OPEN) return;
    if (code === 1000) client.close(1000, reason.slice(0, 120));
    // 1006: the host's end vanished without a close frame, as when the host process dies; its exec
    // sessions lived in its memory, so a restarted host does not have them.
    else if (code === 1006) closeWith(client, 1011, 'bad_gateway', 'the connection to the sandbox host dropped (a host that restarts loses its exec sessions)');
    else closeWith(client, 1011, 'bad_gateway', `the sandbox host closed the stream (${code})`);
  }

  /** Stops reading the client while too much is queued toward the host, until that is written. */
  const watchUpstreamQueue = () => {
    if (clientPausedByUs || upstream.bufferedAmount <= RELAY_HIGH) return;
    clientPausedByUs = true;
    pauseSocket(client);
    upstream.onDrain(resumeClient);
  };
  const toUpstream = (data: Buffer) => {
    upstream.send(data);
    watchUpstreamQueue();
  };

  const onMessage = (data: string | Buffer | ArrayBuffer | Buffer[], binaryFlag?: boolean) => {
    const isBinary = typeof binaryFlag === 'boolean' ? binaryFlag : typeof data !== 'string';
    const buf = Buffer.isBuffer(data) ? data : Array.isArray(data) ? Buffer.concat(data) : typeof data === 'string' ? Buffer.from(data) : Buffer.from(data);
    if (!isBinary || buf.length === 0 || buf[0] !== FRAME_STDIN) {
      const why = !isBinary ? 'text frames are not accepted' : buf.length === 0 ? 'empty frame' : `unknown stream 0x${buf[0]!.toString(16).padStart(2, '0')}`;
      closeWith(client, 1003, 'invalid_request', `bad frame: ${why}; send binary frames 0x00 + stdin bytes`);
      upstream.terminate();
      return;
    }
    if (!opened) {
      pending.push(buf);
      if (!clientPausedByUs && pending.reduce((n, b) => n + b.length, 0) > RELAY_HIGH) {
        clientPausedByUs = true;
        pauseSocket(client);
      }
      return;
    }
    if (upstream.open) toUpstream(buf);
  };
  client.on('message', onMessage);
  for (const [data, flag] of early) onMessage(data, flag);

  const detach = () => {
    clearTimeout(stallTimer);
    upstream.close(1000, 'client left');
  };
  client.on('close', detach);
  client.on('error', detach);
}

/**
 * Registers the WebSocket route (an express-ws route on the app). No-op when the app has no
 * WebSocket support (createApp without a server, in unit tests).
 */
export function registerExecSocket(app: express.Express, deps: ApiDeps, auth: Authenticator, sandbox: SandboxServices): void {
  const wsApp = app as express.Express & { ws?: (path: string, h: (ws: WebSocket, req: Request) => void) => void };
  if (typeof wsApp.ws !== 'function') return;
  const log = deps.logger.child({ route: 'exec-ws' });
  const live = sandbox.live;
  wsApp.ws('/api/sandboxes/:id/exec/:sessionID', (ws, req) => {
    trace(req.params.id ?? '-', 'api:ws-upgraded');
    // Keep what the client sends while we check (stdin may follow the open at once), and stop
    // reading more until the relay is set up.
    const gate = new ReadGate(ws);
    const early: EarlyFrame[] = [];
    const keep = (data: EarlyFrame[0], flag?: boolean) => early.push([data, flag]);
    ws.on('message', keep);
    pauseSocket(ws);
    void (async () => {
      try {
        const org = await auth.authenticate(req);
        trace(req.params.id ?? '-', 'api:ws-authenticated');
        const params = parseOrThrow(ExecSocketParams, req.params, 'path');
        const target = await live.attachTarget(params.sessionID);
        if (!target || target.orgId !== org.id || target.sandboxId !== params.id) throw notFound(`exec session ${params.sessionID}`);
        const host = await live.sandboxHost(org.id, params.id);
        if (ws.readyState !== WebSocket.OPEN) return;
        ws.off('message', keep);
        // Streaming counts as use of the sandbox (written at most once a minute).
        const touch = () => live.touch(params.id);
        relay(deps, live, ws, req.socket, host, { sandboxId: params.id, execId: target.execId }, params.sessionID, target.kind, early, log, touch, gate);
        // A revoked key's stream is closed as its requests are refused (api/auth.ts).
        ws.on(
          'close',
          auth.watch(req, org, () => closeWith(ws, 1008, 'unauthorized', 'the API key was revoked')),
        );
        resumeSocket(ws);
        gate.arm();
      } catch (err) {
        const e = err instanceof ApiError ? err : fromHostError(err, 'exec session');
        closeWith(ws, e.status >= 500 ? 1011 : 1008, e.type, e.message);
      }
    })();
  });
}
