import { WebSocket } from 'ws';
import { decodeExecFrame, type ExecFrame } from '../../sandbox/host-contract/client';
import { api, T } from './env';

/** A raw WebSocket client of /api/sandboxes/:id/exec/:sessionID that records what it receives. */
export class Attached {
  readonly frames: ExecFrame[] = [];
  /** Text frames (the API's error frames). */
  readonly texts: string[] = [];
  readonly closed: Promise<{ code: number; reason: string }>;
  readonly opened: Promise<void>;
  private waiters: (() => void)[] = [];

  constructor(readonly ws: WebSocket) {
    ws.on('message', (data: Buffer, isBinary: boolean) => {
      if (!isBinary) this.texts.push(data.toString());
      else {
        const f = decodeExecFrame(data);
        if (f) this.frames.push(f);
      }
      for (const w of this.waiters.splice(0)) w();
    });
    this.opened = new Promise((resolve, reject) => {
      ws.once('open', () => resolve());
      ws.once('error', reject);
    });
    this.closed = new Promise((resolve) => {
      ws.on('close', (code, reason) => {
        resolve({ code, reason: reason.toString() });
        for (const w of this.waiters.splice(0)) w();
      });
    });
    ws.on('error', () => undefined);
  }

  /** Output of one stream received so far (scrollback and live). */
  text(kind: 'stdout' | 'stderr'): string {
    return Buffer.concat(this.frames.flatMap((f) => (f.kind === kind ? [f.data] : []))).toString();
  }

  get exitCode(): number | undefined {
    const f = this.frames.find((x) => x.kind === 'exit');
    return f?.kind === 'exit' ? f.exitCode : undefined;
  }

  get scrollbackDone(): boolean {
    return this.frames.some((f) => f.kind === 'scrollback-end');
  }

  /** Resolves once `pred` holds (checked on every frame); rejects after `ms`. */
  until(pred: () => boolean, ms = 15_000): Promise<void> {
    if (pred()) return Promise.resolve();
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error(`condition not met in ${ms} ms; got ${JSON.stringify(this.summary())}`)), ms);
      const check = () => {
        if (pred()) {
          clearTimeout(timer);
          resolve();
        } else this.waiters.push(check);
      };
      this.waiters.push(check);
    });
  }

  stdin(data: string | Buffer): void {
    this.ws.send(Buffer.concat([Buffer.from([0x00]), Buffer.from(data)]));
  }

  summary(): unknown {
    return {
      stdout: this.text('stdout').slice(-300),
      stderr: this.text('stderr').slice(-300),
      kinds: this.frames.map((f) => f.kind).slice(-20),
      texts: this.texts,
    };
  }
}

/** Opens an attachment; the key goes in ?api_key= unless `header` (X-API-Key), or nowhere when null. */
export function attach(sandboxId: string, sessionId: string, opts: { key?: string | null; header?: boolean } = {}): Attached {
  const key = opts.key === undefined ? T.key() : opts.key;
  const base = T.api().replace(/^http/, 'ws');
  const query = key !== null && !opts.header ? `?api_key=${encodeURIComponent(key)}` : '';
  const headers = key !== null && opts.header ? { 'x-api-key': key } : undefined;
  return new Attached(new WebSocket(`${base}/api/sandboxes/${sandboxId}/exec/${sessionId}${query}`, { headers }));
}

/** Attaches and waits for the end of the scrollback. */
export async function attachReady(sandboxId: string, sessionId: string): Promise<Attached> {
  const a = attach(sandboxId, sessionId);
  await a.until(() => a.scrollbackDone);
  return a;
}

/** Starts an exec session and returns its object. */
export async function startExec(sandboxId: string, body: Record<string, unknown>): Promise<{ sessionID: string; [k: string]: unknown }> {
  const r = await api('POST', `/api/sandboxes/${sandboxId}/exec`, { body });
  if (r.status !== 201) throw new Error(`create exec: ${r.status} ${JSON.stringify(r.body)}`);
  return r.body;
}

export const getExec = async (sandboxId: string, sessionId: string) => (await api('GET', `/api/sandboxes/${sandboxId}/exec/${sessionId}`)).body;
