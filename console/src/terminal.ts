import { Terminal } from '@xterm/xterm';
import { FitAddon } from '@xterm/addon-fit';
import '@xterm/xterm/css/xterm.css';
import { api, enc, socketProtocols } from './api';
import { h, fill } from './dom';
import { errorBox } from './page';

/**
 * A terminal in a sandbox: POST …/pty starts `bash -l` on a pty, and xterm.js talks to it over the
 * WebSocket (keystrokes as text frames, output as binary frames, `{"type":"resize"}` on resize). The
 * key goes in the subprotocol list, never in the URL. A dropped socket can be reattached (the shell
 * keeps running for 30 s without a client; the last 64 KiB come back first).
 */
export function openTerminal(box: HTMLElement, sandboxId: string, signal: AbortSignal): void {
  const status = h('span', { class: 'term-status muted' }, 'Starting…');
  const controls = h('span');
  const screen = h('div', { class: 'terminal', 'data-testid': 'terminal' });
  fill(box, h('p', null, status, ' ', controls), screen);
  const term = new Terminal({ cursorBlink: true, fontSize: 13, scrollback: 5000, convertEol: false });
  const fit = new FitAddon();
  term.loadAddon(fit);
  term.open(screen);
  fit.fit();
  let ws: WebSocket | null = null;
  let ptyId: string | null = null;
  const sendResize = (): void => {
    if (ws?.readyState === WebSocket.OPEN) ws.send(JSON.stringify({ type: 'resize', cols: term.cols, rows: term.rows }));
  };
  term.onData((d) => {
    if (ws?.readyState === WebSocket.OPEN) ws.send(new TextEncoder().encode(d));
  });
  term.onResize(sendResize);
  const onWindowResize = (): void => fit.fit();
  window.addEventListener('resize', onWindowResize);
  signal.addEventListener('abort', () => {
    window.removeEventListener('resize', onWindowResize);
    ws?.close(1000);
    term.dispose();
  });

  const attach = (): void => {
    if (!ptyId || signal.aborted) return;
    fill(controls);
    status.textContent = 'Connecting…';
    term.reset();
    const proto = location.protocol === 'https:' ? 'wss:' : 'ws:';
    const sock = new WebSocket(`${proto}//${location.host}/api/sandboxes/${enc(sandboxId)}/pty/${enc(ptyId)}`, socketProtocols());
    ws = sock;
    sock.binaryType = 'arraybuffer';
    sock.onopen = () => {
      status.textContent = `Connected (${ptyId})`;
      sendResize();
      term.focus();
    };
    sock.onmessage = (ev) => {
      if (typeof ev.data === 'string') {
        // The API's refusal: {"error":{type,message}} before a 1008 close.
        try {
          const e = (JSON.parse(ev.data) as { error?: { type: string; message: string } }).error;
          if (e) {
            fill(controls, errorBox(new Error(`${e.type}: ${e.message}`)));
            return;
          }
        } catch {
          /* plain text output */
        }
        term.write(ev.data);
      } else term.write(new Uint8Array(ev.data as ArrayBuffer));
    };
    sock.onclose = (ev) => {
      if (signal.aborted || ws !== sock) return;
      if (ev.code === 1000) {
        status.textContent = 'The shell exited.';
        fill(controls, h('button', { onclick: start }, 'New terminal'));
      } else {
        status.textContent = `Disconnected (${ev.code}${ev.reason ? `: ${ev.reason}` : ''}).`;
        controls.append(h('button', { onclick: attach }, 'Reconnect'), ' ', h('button', { onclick: start }, 'New terminal'));
      }
    };
  };

  const start = async (): Promise<void> => {
    fill(controls);
    status.textContent = 'Starting a shell…';
    try {
      const pty = await api<{ sessionID: string }>(`/api/sandboxes/${enc(sandboxId)}/pty`, {
        method: 'POST',
        body: { cols: term.cols, rows: term.rows },
        signal,
      });
      ptyId = pty.sessionID;
      attach();
    } catch (err) {
      if (signal.aborted) return;
      status.textContent = 'No terminal.';
      fill(
        controls,
        errorBox(err, () => void start()),
      );
    }
  };
  void start();
}
