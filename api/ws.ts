import { WebSocket } from 'ws';

/*
 * The public socket comes from express-ws, which bundles ws 7: no pause()/resume() and no
 * isBinary argument on 'message' (text arrives as a string). These work with both ws 7 and 8.
 */
export type AnySocket = WebSocket & { _socket?: { pause(): void; resume(): void } };
export function pauseSocket(ws: AnySocket): void {
  if (typeof (ws as { pause?: unknown }).pause === 'function') ws.pause();
  else ws._socket?.pause();
}
export function resumeSocket(ws: AnySocket): void {
  if (typeof (ws as { resume?: unknown }).resume === 'function') ws.resume();
  else ws._socket?.resume();
}

/** Refuses or ends a WebSocket: the error body as a text frame, then a close with `code` and a short reason. */
export function closeWith(ws: WebSocket, code: number, type: string, message: string): void {
  if (ws.readyState !== WebSocket.OPEN) {
    ws.terminate();
    return;
  }
  ws.send(JSON.stringify({ error: { type, message } }));
  ws.close(code, `${type}: ${message}`.slice(0, 120));
  // Read the peer's close frame even if reading was paused (else the close waits for a timeout).
  resumeSocket(ws as AnySocket);
}
