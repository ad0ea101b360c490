import type { Request, Response } from 'express';

/** A Server-Sent Events answer: `event: <name>` + one JSON `data:` line per send. */
export interface SseStream {
  send(event: string, data: unknown): void;
  end(): void;
}

/** Starts Server-Sent Events on `res` (200, text/event-stream, a keep-alive comment every 15 s). */
export function sse(res: Response): SseStream {
  res.status(200);
  res.setHeader('content-type', 'text/event-stream; charset=utf-8');
  res.setHeader('cache-control', 'no-cache');
  res.setHeader('x-accel-buffering', 'no');
  res.flushHeaders();
  const keepalive = setInterval(() => res.write(': keepalive\n\n'), 15_000);
  keepalive.unref();
  return {
    send: (event, data) => {
      if (!res.writableEnded) res.write(`event: ${event}\ndata: ${JSON.stringify(data)}\n\n`);
    },
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
