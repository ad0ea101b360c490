/**
 * An exec session streamed in the answer to its own start (`POST …/exec` with `Accept:
 * text/event-stream`): one request from the caller to its first output, where the start and a
 * WebSocket attach are two. The API asks the host for the session's output with its create, on
 * the same kept-alive connections (the host's `execFrames`: it waits for the start), and reads it
 * for the caller, who counts as one attached client (`maxRunAfterDisconnect` applies once it leaves). Output is text here: each stream is decoded as
 * UTF-8 across chunk boundaries (a character split between two reads is sent whole); a client that
 * needs the exact bytes attaches by WebSocket.
 */
import { StringDecoder } from 'node:string_decoder';
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

/** Bytes of output kept before the stream is piped, above which the host's answer is read no more until then. */
const EARLY_MAX = 1024 * 1024;

/** The host's output of one session as the piping reads it (an `execFrames` answer, or a WebSocket). */
interface FrameSource {
  pause(): void;
  resume(): void;
  close(): void;
}

/** Where the frames go once piped. */
interface FrameSinkFns {
  frame(payload: Buffer): void;
  end(err?: Error): void;
}

/**
 * The host's output of a session being started, asked for with the session's create (`execFrames`
 * with `awaitStartMs`: the host waits for the start), on the host client's kept-alive connections:
 * the first output can come with the create's answer. What arrives is kept until `pipeExecStream`
 * takes it (reading pauses beyond EARLY_MAX).
 */
export class HostExecStream {
  readonly source: FrameSource;
  private readonly early: Buffer[] = [];
  private earlyBytes = 0;
  /** The host answered 200 (frames follow). */
  opened = false;
  private ended: { err?: Error } | null = null;
  private sink: FrameSinkFns | null = null;

  constructor(
    readonly host: HostClient,
    readonly sandboxId: string,
    readonly execId: string,
  ) {
    trace(sandboxId, 'api:stream-asked');
    this.source = host.openExecFrames(
      sandboxId,
      execId,
      { awaitStartMs: 5000 },
      {
        onOpen: () => {
          this.opened = true;
          trace(sandboxId, 'api:stream-open');
        },
        onFrame: (payload) => {
          if (this.sink) return this.sink.frame(payload);
          this.early.push(payload);
          this.earlyBytes += payload.length;
          if (this.earlyBytes > EARLY_MAX) this.source.pause();
        },
        onEnd: (err) => {
          if (this.sink) this.sink.end(err);
          else this.ended = { err };
        },
      },
    );
  }

  /** Hands what was kept, and what comes, to `sink`. */
  takeOver(sink: FrameSinkFns): void {
    this.sink = sink;
    for (const p of this.early.splice(0)) sink.frame(p);
    if (this.ended) sink.end(this.ended.err);
  }

  /** The start failed: the host's wait ends with the request. */
  abandon(): void {
    this.source.close();
  }
}

/**
 * Reads the host's output of exec session `execId` into `out` until the command exits, the host's
 * answer ends, the reader leaves, or the reader has held the stream paused `stallMs` (then `end`
 * says so: a reader that reads nothing does not keep the command paused for ever). Resolves when
 * done. A host that refused the early request (one without `execFrames`) is attached to by WebSocket.
 */
export function pipeExecStream(live: ExecLive, stream: HostExecStream, out: ExecStreamOut, stallMs: number): Promise<void> {
  const { host, sandboxId, execId } = stream;
  return new Promise<void>((resolve) => {
    const text = { stdout: new StringDecoder('utf8'), stderr: new StringDecoder('utf8') };
    let source = stream.source;
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
      source.close();
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
    const onFrame = (data: Buffer) => {
      if (done || exiting) return;
      const f = decodeExecFrame(data);
      if (!f) return;
      if (f.kind === 'stdout' || f.kind === 'stderr') {
        trace(sandboxId, 'api:stream-output');
        live.touch(sandboxId);
        const s = text[f.kind].write(f.data);
        if (!s || out.output(f.kind, s) || waiting) return;
        waiting = true;
        source.pause();
        stall = setTimeout(
          () => finish({ error: new ApiError('rate_limited', `the stream stayed paused ${stallMs / 1000} s: the client reads nothing`) }),
          stallMs,
        );
        void out.drained().then(() => {
          waiting = false;
          clearTimeout(stall);
          if (!done) source.resume();
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
      if (source === stream.source && !stream.opened) {
        // The host refused the early request (a host of an older version has no execFrames): the
        // session has started now, so attach to it by WebSocket.
        const ws = host.openExecSocket(sandboxId, execId);
        source = {
          pause: () => ws.pause(),
          resume: () => ws.resume(),
          close: () => (ws.readyState === ws.OPEN ? ws.close(1000, 'client left') : ws.terminate()),
        };
        ws.on('message', (d: Buffer, isBinary: boolean) => isBinary && onFrame(d));
        ws.on('close', lost);
        ws.on('error', () => undefined);
        return;
      }
      finish({
        error: new ApiError('bad_gateway', 'the sandbox host ended the stream before the command exited (the sandbox was deleted, or its host restarted)'),
      });
    };
    stream.takeOver({ frame: onFrame, end: lost });
    if (!waiting && !done && source === stream.source) source.resume();
  });
}
