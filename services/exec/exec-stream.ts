/**
 * An exec session streamed in the answer to its own start (`POST …/exec` with `Accept:
 * text/event-stream`): one request from the caller to its first output, where the start and a
 * WebSocket attach are two. The API reads the host's exec stream for the caller, as the WebSocket
 * relay does for a public client, so the caller counts as one attached client
 * (`maxRunAfterDisconnect` applies once it leaves). Output is text here: each stream is decoded as
 * UTF-8 across chunk boundaries (a character split between two reads is sent whole); a client that
 * needs the exact bytes attaches by WebSocket.
 */
import { StringDecoder } from 'node:string_decoder';
import type { WebSocket } from 'ws';
import { ApiError } from '../../contract/errors';
import { trace } from '../../lib/trace';
import type { HostClient } from '../../sandbox';
import { decodeExecFrame } from '../../sandbox';
import type { ExecLive } from './exec-live';
import { liveExec } from './exec-live';

/** Where a streamed session's events go; the API writes them as server-sent events. */
export interface ExecStreamOut {
  /** Output text of one stream; false when the reader is behind (nothing more is read until `drained`). */
  output(stream: 'stdout' | 'stderr', text: string): boolean;
  /** Resolves when the reader has taken what was written. */
  drained(): Promise<void>;
  /** The last event: the command's exit, or why the stream ended without one. */
  end(last: { exit: { exitCode: number; oomKilled?: boolean } } | { error: ApiError }): void;
  /** Aborted when the reader has gone: the host's stream is closed, the command keeps its own terms. */
  readonly signal: AbortSignal;
}

/** Bytes of output kept before the stream is piped, above which the host's stream is paused. */
const EARLY_MAX = 1024 * 1024;

/**
 * The host's stream of a session being started, opened with the session's create (the host waits
 * for the start, `awaitStartMs`): the first output can come before the create's answer. What
 * arrives is kept until `pipeExecStream` takes it (reading pauses beyond EARLY_MAX).
 */
export class HostExecStream {
  readonly ws: WebSocket;
  readonly early: Buffer[] = [];
  private earlyBytes = 0;
  opened = false;
  closed = false;

  constructor(
    readonly host: HostClient,
    readonly sandboxId: string,
    readonly execId: string,
  ) {
    this.ws = host.openExecSocket(sandboxId, execId, { awaitStartMs: 5000 });
    this.ws.on('error', () => undefined);
    this.ws.once('open', () => {
      this.opened = true;
      trace(sandboxId, 'api:stream-open');
    });
    this.ws.once('close', () => (this.closed = true));
    this.ws.on('message', this.keep);
  }

  private readonly keep = (data: Buffer, isBinary: boolean): void => {
    if (!isBinary) return;
    this.early.push(data);
    this.earlyBytes += data.length;
    if (this.earlyBytes > EARLY_MAX) this.ws.pause();
  };

  /** Stops keeping output: the piping reads it from here. */
  takeOver(): void {
    this.ws.off('message', this.keep);
  }

  /** The start failed: the host's wait ends with the socket. */
  abandon(): void {
    this.ws.off('message', this.keep);
    this.ws.terminate();
  }
}

/**
 * Reads the host's stream of exec session `execId` into `out` until the command exits, the host's
 * stream ends, the reader leaves, or the reader has held the stream paused `stallMs` (then `end`
 * says so: a reader that reads nothing does not keep the command paused for ever). Resolves when done.
 * A host that refused the early attach (one that does not wait for starts) is attached to again.
 */
export function pipeExecStream(live: ExecLive, stream: HostExecStream, out: ExecStreamOut, stallMs: number): Promise<void> {
  const { host, sandboxId, execId } = stream;
  stream.takeOver();
  return new Promise<void>((resolve) => {
    const text = { stdout: new StringDecoder('utf8'), stderr: new StringDecoder('utf8') };
    let ws = stream.ws;
    let done = false;
    /** The exit frame came: the end waits for the host's record of the session, nothing else counts. */
    let exiting = false;
    /** Reading is paused until the reader drains. */
    let waiting = false;
    let stall: NodeJS.Timeout | undefined;
    const stop = () => {
      done = true;
      clearTimeout(stall);
      out.signal.removeEventListener('abort', onAbort);
      ws.removeAllListeners('message');
      ws.removeAllListeners('close');
      ws.on('error', () => undefined);
      if (ws.readyState === ws.OPEN) ws.close(1000, 'client left');
      else ws.terminate();
      resolve();
    };
    const finish = (last: Parameters<ExecStreamOut['end']>[0]) => {
      if (done) return;
      for (const k of ['stdout', 'stderr'] as const) {
        const rest = text[k].end();
        if (rest) out.output(k, rest);
      }
      out.end(last);
      stop();
    };
    const onAbort = () => {
      if (!done) stop();
    };
    out.signal.addEventListener('abort', onAbort);
    const onFrame = (data: Buffer, isBinary: boolean) => {
      if (!isBinary || done || exiting) return;
      const f = decodeExecFrame(data);
      if (!f) return;
      if (f.kind === 'stdout' || f.kind === 'stderr') {
        trace(sandboxId, 'api:stream-output');
        live.touch(sandboxId);
        const s = text[f.kind].write(f.data);
        if (!s || out.output(f.kind, s) || waiting) return;
        waiting = true;
        ws.pause();
        stall = setTimeout(
          () => finish({ error: new ApiError('rate_limited', `the stream stayed paused ${stallMs / 1000} s: the client reads nothing`) }),
          stallMs,
        );
        void out.drained().then(() => {
          waiting = false;
          clearTimeout(stall);
          if (!done) ws.resume();
        });
      } else if (f.kind === 'exit') {
        // The exit frame has the code; the host's record of the session adds whether the OOM killer struck.
        const code = f.exitCode;
        exiting = true;
        clearTimeout(stall);
        void liveExec(host, sandboxId, execId)
          .catch(() => null)
          .then((info) => {
            const oomKilled = info && !info.running ? info.oomKilled : undefined;
            void live.recordExit('exec', execId, code, info?.exitedAt ? new Date(info.exitedAt) : new Date(), oomKilled);
            finish({ exit: { exitCode: code, ...(oomKilled ? { oomKilled: true } : {}) } });
          });
      }
    };
    const lost = () => {
      if (exiting || done) return;
      if (ws === stream.ws && !stream.opened) {
        // The host refused the early attach (a host that does not wait for starts answers 404 before
        // the start): the session has started now, so attach again.
        ws.removeAllListeners('message');
        ws.removeAllListeners('close');
        use(host.openExecSocket(sandboxId, execId));
        return;
      }
      finish({
        error: new ApiError('bad_gateway', 'the sandbox host ended the stream before the command exited (the sandbox was deleted, or its host restarted)'),
      });
    };
    const use = (w: WebSocket) => {
      ws = w;
      ws.on('message', onFrame);
      ws.on('close', lost);
      ws.on('error', () => undefined);
    };
    for (const data of stream.early.splice(0)) onFrame(data, true);
    use(ws);
    if (ws.isPaused && !waiting && !done) ws.resume();
    if (stream.closed) lost();
  });
}
