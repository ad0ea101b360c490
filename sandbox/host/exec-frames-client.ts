/**
 * An exec session's client whose frames go in an HTTP answer (`GET …/exec/:sid/frames`, the
 * `execFrames` route), not a WebSocket: the control plane reads a streamed start's output on a
 * kept-alive connection, with no new connection and no upgrade in the way of the first byte. The
 * session sees it as any client (./exec-session.ts): its backlog is the answer's unsent bytes, a
 * close ends the answer, and it leaves when the answer's connection does.
 */
import { EventEmitter } from 'node:events';
import type { ServerResponse } from 'node:http';
import { WebSocket } from 'ws';
import type { ExecClient } from './exec-session';

export class HttpFramesClient extends EventEmitter implements ExecClient {
  constructor(private readonly res: ServerResponse) {
    super();
    res.once('close', () => this.emit('close'));
  }

  get readyState(): number {
    return this.res.destroyed || this.res.writableEnded ? WebSocket.CLOSED : WebSocket.OPEN;
  }

  get bufferedAmount(): number {
    return this.res.writableLength + (this.res.socket?.writableLength ?? 0);
  }

  /** Ends the answer (after the exit frame): the connection goes back to the caller's pool. */
  close(): void {
    if (!this.res.writableEnded) this.res.end();
  }

  terminate(): void {
    this.res.destroy();
  }
}
