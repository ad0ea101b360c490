import type { Request, Response } from 'express';

/** A Server-Sent Events answer: `event: <name>` + one JSON `data:` line per send. */
export interface SseStream {
  /** Writes one event; false when the reader is behind (wait for the answer's 'drain'). */
  send(event: string, data: unknown): boolean;
  end(): void;
}

/**
 * Starts Server-Sent Events on `res` (`status`, 200 by default; text/event-stream; a keep-alive
 * comment every 15 s). The headers go at once, or with the first event when `flush` is false.
 */
export function sse(res: Response, opts: { status?: number; flush?: boolean } = {}): SseStream {
  res.status(opts.status ?? 200);
  res.setHeader('content-type', 'text/event-stream; charset=utf-8');
  res.setHeader('cache-control', 'no-cache');
  res.setHeader('x-accel-buffering', 'no');
  if (opts.flush ?? true) res.flushHeaders();
  const keepalive = setInterval(() => res.write(': keepalive\n\n'), 15_000);
  keepalive.unref();
  return {
    send: (event, data) => (res.writableEnded ? true : res.write(`event: ${event}\ndata: ${JSON.stringify(data)}\n\n`)),
    end: () => {
      clearInterval(keepalive);
      if (!res.writableEnded) res.end();
    },
  };
}

/** Server-Sent Events when the request asks for them (Accept: text/event-stream), else null. */
export function sseIfAsked(req: Request, res: Response): SseStream | null {
  return (req.header('accept') ?? '').includes('text/event-stream') ? sse(res) : null;
}
